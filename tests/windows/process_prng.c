/* bcryptprimitives.dll for Wine 8, which lacks it: Rust's std (1.78+) imports ProcessPrng from
 * it for HashMap keys and randomness. ProcessPrng never fails on real Windows; RtlGenRandom
 * (advapi32's SystemFunction036) gives the same thing on Wine. Built and installed into the
 * wine prefix by wine-runner.sh; never shipped. */
#include <windows.h>
#include <ntsecapi.h>

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG n = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!RtlGenRandom(data, n)) return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
