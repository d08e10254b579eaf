/* Run with LD_PRELOAD=libmemhook.so MEMHOOK_TRACE=1: maps and unmaps a
 * marker-sized region; ffi/tests/examples.rs checks the trace lines on stderr. */
#include <sys/mman.h>

int main(void) {
    void *p = mmap(0, 0x13000, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;
    return munmap(p, 0x13000) != 0;
}
