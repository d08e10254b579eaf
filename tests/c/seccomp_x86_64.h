/* What tests/c/refuse_membarrier.c and tests/c/stack_use.c share: the
 * start of a seccomp filter that lets calls of other architectures pass
 * and loads the x86_64 system call's number, and its install. */
#ifndef MEMHOOK_TESTS_SECCOMP_X86_64_H
#define MEMHOOK_TESTS_SECCOMP_X86_64_H

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>

/* The filter's first four statements: the call's number in the
 * accumulator (an x86_64 call), or the call allowed. */
#define SECCOMP_X86_64_NR                                                    \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)), \
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),        \
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),                        \
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))

/* Installs the filter of `n` statements at `f` on this thread and those it
 * makes (and the programs it runs), with no new privileges: 0, or -1 with
 * errno. */
static int install_seccomp_filter(struct sock_filter *f, unsigned short n) {
    struct sock_fprog program = {n, f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program);
}

#endif
