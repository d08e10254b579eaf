/* Runs a program where the kernel refuses membarrier (ENOSYS), as an old
 * kernel or a container's seccomp filter does, to measure memhook's
 * fallback (grace waits) in a real process:
 *   cc -O2 -o refuse_membarrier tests/c/refuse_membarrier.c
 *   ./refuse_membarrier python3 tests/gpu/install_in_torch.py
 * (linux/tests/no_membarrier.rs tests the same fallback in CI.) x86_64. */
#include <errno.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "seccomp_x86_64.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PROGRAM [ARG...]\n", argv[0]);
        return 2;
    }
    struct sock_filter filter[] = {
        SECCOMP_X86_64_NR,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_membarrier, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    if (install_seccomp_filter(filter, sizeof filter / sizeof filter[0]) != 0) {
        perror("refuse_membarrier: seccomp");
        return 1;
    }
    execvp(argv[1], argv + 1);
    perror("refuse_membarrier: exec");
    return 127;
}
