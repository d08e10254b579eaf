/* Hand-written prologues for the bistro tests, built into a shared object
 * (cc -shared) and dlopen'ed by linux/tests/bistro.rs. */
        .intel_syntax noprefix
        .text

/* endbr64, then RIP-relative lea and cmp, and a jcc out of the patch. */
        .globl mh_t_rip
        .type mh_t_rip, @function
        .p2align 4
mh_t_rip:
        endbr64
        lea rax, [rip + data_local]
        cmp dword ptr [rip + data_local], 7
        jne 2f
        mov eax, dword ptr [rax]
        add eax, edi
        ret
2:      mov eax, -1
        ret
        int3

/* A call rel32 as the first instruction. */
        .globl mh_t_call
        .type mh_t_call, @function
        .p2align 4
mh_t_call:
        call hundred_local
        add eax, edi
        ret
        int3
        .p2align 4
hundred_local:
        mov eax, 100
        ret
        int3

/* A jcc rel8 that leaves the patched bytes. */
        .globl mh_t_jcc
        .type mh_t_jcc, @function
        .p2align 4
mh_t_jcc:
        test edi, edi
        js 3f
        lea eax, [rdi + rdi]
        ret
3:      xor eax, eax
        ret
        int3

/* Shorter than the patch. */
        .globl mh_t_tiny
        .type mh_t_tiny, @function
        .p2align 4
mh_t_tiny:
        xor eax, eax
        ret
        int3
        int3
        int3
        int3
        int3
        int3
        int3
        int3

/* A loop back into the entry. */
        .globl mh_t_loop
        .type mh_t_loop, @function
        .p2align 4
mh_t_loop:
4:      dec edi
        jnz 4b
        mov eax, 5
        ret
        int3

/* Counts its calls (for the stress test). */
        .globl mh_t_count
        .type mh_t_count, @function
        .p2align 4
mh_t_count:
        endbr64
        lock inc qword ptr [rip + counter_local]
        mov eax, edi
        ret
        int3

/* Three more that count, each its own calls (for the batch tests). */
        .macro counting name, counter
        .globl \name
        .type \name, @function
        .p2align 4
\name:
        endbr64
        lock inc qword ptr [rip + \counter\()_local]
        mov eax, edi
        ret
        int3
        .endm
        counting mh_t_count2, mh_t_counter2
        counting mh_t_count3, mh_t_counter3
        counting mh_t_count4, mh_t_counter4

/* One-byte instructions under the patch: a thread that the scheduler or
 * a signal stops between two of them stands inside the bytes the entry
 * jump overwrites (glibc's dlsym starts `push rbp; push rbx`). */
        .globl mh_t_steps
        .type mh_t_steps, @function
        .p2align 4
mh_t_steps:
        push rbx
        push rbp
        pop rbp
        pop rbx
        lock inc qword ptr [rip + steps_local]
        mov eax, edi
        ret
        int3

/* mh_t_sys(a0, a1, a2, nr): a system call inside the patched bytes, so a
 * thread blocked in it returns to the middle of them. */
        .globl mh_t_sys
        .type mh_t_sys, @function
        .p2align 4
mh_t_sys:
        mov eax, ecx
        syscall
        nop
        ret
        int3

/* First instructions bistro keeps ahead of its patch (so a uprobe on the
 * entry leaves the hook whole), each as a real library has it: libcuda's
 * `push rbp` (the patch's way to the hook undoes it), a stack allocation
 * (Debian glibc's mremap: `sub rsp, 0x58`), and a system-call wrapper's
 * `mov eax, n` (Debian glibc's munmap; here getpid, plus the argument);
 * mh_t_single, mh_t_load, mh_t_test and mh_t_arg below: a read of a
 * global compared, a global loaded, an argument tested, an unread
 * argument register written. */
        .globl mh_t_frame
        .type mh_t_frame, @function
        .p2align 4
mh_t_frame:
        push rbp
        mov rbp, rsp
        push r12
        lea eax, [rdi + 7]
        pop r12
        pop rbp
        ret
        int3

        .globl mh_t_alloca
        .type mh_t_alloca, @function
        .p2align 4
mh_t_alloca:
        sub rsp, 0x58
        mov qword ptr [rsp + 0x40], rdi
        mov rax, qword ptr [rsp + 0x40]
        add eax, 9
        add rsp, 0x58
        ret
        int3

        .globl mh_t_getpid
        .type mh_t_getpid, @function
        .p2align 4
mh_t_getpid:
        mov eax, 39
        syscall
        add eax, edi
        ret
        int3

/* A read of a global first, as glibc's cancellation check (Debian 12's
 * fallocate: `cmp byte [rip+d], 0`), kept with its address re-aimed in
 * the trampoline (the byte is 42: a copy that read elsewhere would not
 * find it). */
        .globl mh_t_single
        .type mh_t_single, @function
        .p2align 4
mh_t_single:
        cmp byte ptr [rip + single_local], 42
        jne 5f
        lea eax, [rdi + 11]
        ret
5:      mov eax, -1
        ret
        int3

/* A load of a global into rax (glibc's many `mov rax, [rip+d]` entries:
 * a GOT slot or the library's data), kept with its address re-aimed in
 * the trampoline (the word is 13: a copy that read elsewhere would not
 * return a + 13). */
        .globl mh_t_load
        .type mh_t_load, @function
        .p2align 4
mh_t_load:
        mov rax, qword ptr [rip + load_local]
        add eax, edi
        nop
        nop
        ret
        int3

/* A test of an argument, whose flags the code after it branches on
 * (glibc's `test rdi, rdi` entries): kept, and run again by the
 * trampoline after the hook (whose own flags would take the wrong way:
 * 13 for any a, not a + 13). */
        .globl mh_t_test
        .type mh_t_test, @function
        .p2align 4
mh_t_test:
        test edi, edi
        jz 6f
        lea eax, [rdi + 13]
        ret
6:      mov eax, 13
        ret
        int3

/* A write of an argument register the function never reads (glibc's
 * `mov edx, edi` entries, of one- or two-argument functions): kept, so
 * the hook runs with edi (its one argument) as the caller passed it, and
 * run again by the trampoline (the original returns a + 17 only from
 * esi as the copy sets it: the caller's esi is whatever it was). */
        .globl mh_t_arg
        .type mh_t_arg, @function
        .p2align 4
mh_t_arg:
        mov esi, edi
        lea eax, [rsi + 17]
        nop
        nop
        ret
        int3

        .data
single_local:
        .byte 42
        .p2align 3
load_local:
        .quad 13
        .p2align 3
        .globl mh_t_counter2, mh_t_counter3, mh_t_counter4
mh_t_counter2:
mh_t_counter2_local:
        .quad 0
mh_t_counter3:
mh_t_counter3_local:
        .quad 0
mh_t_counter4:
mh_t_counter4_local:
        .quad 0
data_local:
        .long 7
        .p2align 3
        .globl mh_t_counter
        .type mh_t_counter, @object
counter_local:
mh_t_counter:
        .quad 0
        .globl mh_t_steps_counter
        .type mh_t_steps_counter, @object
steps_local:
mh_t_steps_counter:
        .quad 0

        .section .note.GNU-stack,"",@progbits
