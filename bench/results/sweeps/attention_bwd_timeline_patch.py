"""Patch a generated attention-backward main kernel's Gluon source so consumer0 records %clock64 at five points a CTA
(entry, K/V arrived, first step done, loop done, epilogue done) and %smid, written over the first 64 bytes of its
own dK block (timing probe only: the dK numbers are then wrong)."""
import re

CLK = 'gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [tile], dtype=gl.int64, is_pure=False, pack=1)'
SMID = 'gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [tile], dtype=gl.int32, is_pure=False, pack=1)'


def patch(src: str) -> str:
    a = src.index("def consumer0(")
    b = src.index("@gluon.jit", a)
    c = src[a:b]
    c = c.replace("    tile = gl.program_id(0)\n", f"    tile = gl.program_id(0)\n    _t0 = {CLK}\n", 1)
    m = re.search(r"    mbarrier\.wait\(g1_ready\.index\(g1_s\), \(g1_n // 1\) & 1\)\n", c)
    c = c[:m.end()] + f"    _t1 = {CLK}\n    _t2 = _t1\n" + c[m.end():]
    m = re.search(r"\n        v_dk_c0, v_dv_c0 = ", c)
    c = c[:m.start()] + f"\n        if j == 0:\n            _t2 = {CLK}" + c[m.start():]
    m = re.search(r"\n    # release\(\) \{group='g1'", c)
    c = c[:m.start()] + f"\n    _t3 = {CLK}" + c[m.start():]
    k = c.rindex("    tma.store_wait(0)\n") + len("    tma.store_wait(0)\n")
    rec = (f"    _t4 = {CLK}\n    _sm = {SMID}\n    gl.thread_barrier()\n"
           "    _p = (dk_ptr + (pid_bh // Hkv * dk_rb + pid_bh % Hkv * dk_rh + pid_n * 128).to(gl.int64)"
           " * (128 + (Hkv - 1) * dk_ch) + (pid_bh % Hkv * dk_ch)).to(gl.pointer_type(gl.int64), bitcast=True)\n"
           "    gl.store(_p, _t0)\n    gl.store(_p + 1, _t1)\n    gl.store(_p + 2, _t2)\n    gl.store(_p + 3, _t3)\n"
           "    gl.store(_p + 4, _t4)\n    gl.store(_p + 5, _sm.to(gl.int64))\n")
    c = c[:k] + rec + c[k:]
    return src[:a] + c + src[b:]


def nostore(src: str) -> str:
    """The dK/dV pointer stores predicated off by a condition false at run time (scale < 0): no memory traffic, the
    address math and the store instructions stay."""
    pat = r"gl\.store\((v_d[kv]16_c\d_p), (v_d[kv]16_c\d), mask=\("
    out, n = re.subn(pat, r"gl.store(\1, \2, mask=(scale < 0) & (",
                     src)
    assert n == 4, n
    return out
