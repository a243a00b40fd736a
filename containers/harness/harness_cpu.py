"""The CPU the runtime sees, as it sees it: CPUID on x86_64, HWCAP/HWCAP2 (the auxiliary vector) on aarch64.

Stdlib only (ctypes, mmap). Under QEMU user mode these are what QEMU presents for its `-cpu` model (so a
runtime that picks its kernels from CPUID or HWCAP picks those of the emulated CPU), never the host's
/proc/cpuinfo. Feature names are spelled as Linux's /proc/cpuinfo spells them.

    cpu_info() -> {"model": str, "features": [sorted names], "source": "cpuid" | "hwcap" | "none"}
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform

# (leaf, subleaf, register, bit) -> the name /proc/cpuinfo uses (arch/x86/include/asm/cpufeatures.h)
X86_BITS = {
    (1, 0, "edx", 25): "sse", (1, 0, "edx", 26): "sse2", (1, 0, "ecx", 0): "pni", (1, 0, "ecx", 1): "pclmulqdq",
    (1, 0, "ecx", 9): "ssse3", (1, 0, "ecx", 12): "fma", (1, 0, "ecx", 19): "sse4_1", (1, 0, "ecx", 20): "sse4_2",
    (1, 0, "ecx", 22): "movbe", (1, 0, "ecx", 23): "popcnt", (1, 0, "ecx", 25): "aes", (1, 0, "ecx", 26): "xsave",
    (1, 0, "ecx", 28): "avx", (1, 0, "ecx", 29): "f16c", (1, 0, "ecx", 30): "rdrand",
    (7, 0, "ebx", 3): "bmi1", (7, 0, "ebx", 5): "avx2", (7, 0, "ebx", 8): "bmi2", (7, 0, "ebx", 16): "avx512f",
    (7, 0, "ebx", 17): "avx512dq", (7, 0, "ebx", 21): "avx512ifma", (7, 0, "ebx", 28): "avx512cd",
    (7, 0, "ebx", 29): "sha_ni", (7, 0, "ebx", 30): "avx512bw", (7, 0, "ebx", 31): "avx512vl",
    (7, 0, "ecx", 1): "avx512vbmi", (7, 0, "ecx", 6): "avx512_vbmi2", (7, 0, "ecx", 8): "gfni",
    (7, 0, "ecx", 9): "vaes", (7, 0, "ecx", 10): "vpclmulqdq", (7, 0, "ecx", 11): "avx512_vnni",
    (7, 0, "ecx", 12): "avx512_bitalg", (7, 0, "ecx", 14): "avx512_vpopcntdq",
    (7, 0, "edx", 22): "amx_bf16", (7, 0, "edx", 23): "avx512_fp16", (7, 0, "edx", 24): "amx_tile",
    (7, 0, "edx", 25): "amx_int8", (7, 1, "eax", 4): "avx_vnni", (7, 1, "eax", 5): "avx512_bf16",
}
# AT_HWCAP (16) and AT_HWCAP2 (26) bits -> names (arch/arm64/include/uapi/asm/hwcap.h)
HWCAP = ("fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "atomics", "fphp", "asimdhp", "cpuid",
         "asimdrdm", "jscvt", "fcma", "lrcpc", "dcpop", "sha3", "sm3", "sm4", "asimddp", "sha512", "sve", "asimdfhm",
         "dit", "uscat", "ilrcpc", "flagm", "ssbs", "sb", "paca", "pacg")
HWCAP2 = ("dcpodp", "sve2", "sveaes", "svepmull", "svebitperm", "svesha3", "svesm4", "flagm2", "frint", "svei8mm",
          "svef32mm", "svef64mm", "svebf16", "i8mm", "bf16", "dgh", "rng", "bti")

# cpuid(leaf edi, subleaf esi, out rdx: 4 x uint32) in x86-64 machine code (System V ABI)
_CPUID = bytes([0x53,                          # push rbx
                0x89, 0xF8,                    # mov eax, edi
                0x89, 0xF1,                    # mov ecx, esi
                0x49, 0x89, 0xD0,              # mov r8, rdx
                0x0F, 0xA2,                    # cpuid
                0x41, 0x89, 0x00,              # mov [r8], eax
                0x41, 0x89, 0x58, 0x04,        # mov [r8+4], ebx
                0x41, 0x89, 0x48, 0x08,        # mov [r8+8], ecx
                0x41, 0x89, 0x50, 0x0C,        # mov [r8+12], edx
                0x5B,                          # pop rbx
                0xC3])                         # ret


class _Cpuid:
    def __init__(self):
        self._page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        self._page.write(_CPUID)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        self._fn = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32))(address)

    def __call__(self, leaf: int, subleaf: int = 0) -> dict[str, int]:
        out = (ctypes.c_uint32 * 4)()
        self._fn(leaf, subleaf, out)
        return dict(zip(("eax", "ebx", "ecx", "edx"), out))


def _x86() -> dict:
    cpuid = _Cpuid()
    top = cpuid(0)["eax"]
    regs = {(leaf, sub): cpuid(leaf, sub) for leaf, sub in ((1, 0), (7, 0), (7, 1)) if leaf <= top}
    features = {name for (leaf, sub, reg, bit), name in X86_BITS.items()
                if (leaf, sub) in regs and regs[(leaf, sub)][reg] >> bit & 1}
    brand = b""
    if cpuid(0x80000000)["eax"] >= 0x80000004:
        for leaf in (0x80000002, 0x80000003, 0x80000004):
            r = cpuid(leaf)
            brand += b"".join(r[k].to_bytes(4, "little") for k in ("eax", "ebx", "ecx", "edx"))
    model = " ".join(brand.split(b"\0", 1)[0].decode("ascii", "replace").split())
    return {"model": model or "x86_64", "features": sorted(features), "source": "cpuid"}


def _arm64() -> dict:
    getauxval = ctypes.CDLL(None).getauxval
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    hwcap, hwcap2 = getauxval(16), getauxval(26)
    features = [n for i, n in enumerate(HWCAP) if hwcap >> i & 1] + [n for i, n in enumerate(HWCAP2) if hwcap2 >> i & 1]
    model = os.environ.get("QEMU_CPU") or _cpuinfo_part() or "aarch64"
    return {"model": model, "features": sorted(features), "source": "hwcap"}


def _cpuinfo_part() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith(("cpu part", "model name")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_info() -> dict:
    """The CPU as the runtime in this process sees it (never raises: "source": "none" when it cannot tell)."""
    machine = platform.machine()
    try:
        if machine in ("x86_64", "AMD64"):
            return _x86()
        if machine in ("aarch64", "arm64"):
            return _arm64()
    except (OSError, ValueError, AttributeError) as exc:
        return {"model": machine, "features": [], "source": "none", "error": str(exc)}
    return {"model": machine, "features": [], "source": "none"}


if __name__ == "__main__":
    import json

    print(json.dumps(cpu_info()))
