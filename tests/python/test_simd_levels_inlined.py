"""tests/simd_levels_inlined.py, the check that a per-level kernel calls nothing compiled for the
baseline: on made-up disassembly it names a wide kernel's call to a shared out-of-line function,
and lets through calls through the PLT and calls between functions of one level."""
import importlib.util
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(TESTS, "simd_levels_inlined.py")
spec = importlib.util.spec_from_file_location("simd_levels_inlined", SCRIPT)
checker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checker)

LAMBDA = ("auto moe::softmax_rows_masked_groups<float>(float*, long, int, int, int, int)::"
          "{lambda(auto:1, int)#1}::operator()<std::integral_constant<int, 4> >"
          "(std::integral_constant<int, 4>, int) const [clone .isra.0]")


def disassembly(*functions):
    """objdump -d -C text: (name, [call targets]) per function."""
    lines, address = [], 0x1000
    for name, targets in functions:
        lines += ["", f"{address:016x} <{name}>:", f"    {address:x}:\tpush   %rbp"]
        for target in targets:
            address += 8
            lines.append(f"    {address:x}:\tcall   {address + 0x400:x} <{target}>")
        lines.append(f"    {address + 4:x}:\tret")
        address += 0x100
    return "\n".join(lines) + "\n"


def test_a_wide_kernel_calling_a_shared_function_is_named():
    text = disassembly(
        ("moe::(anonymous namespace)::masked_f32_avx512(float*, long, int, int, int, int)",
         ["memset@plt", LAMBDA]),
        ("moe::(anonymous namespace)::masked_f32_avx2(float*, long, int, int, int, int)",
         [LAMBDA]),
        ("moe::(anonymous namespace)::masked_f32_sse2(float*, long, int, int, int, int)",
         [LAMBDA]),
        (LAMBDA, []),
    )
    bad, kernels = checker.out_of_level_calls(text)
    assert kernels == 2  # the avx2 and avx512 functions; sse2 is the baseline itself
    assert sorted(caller.split("::")[-1].split("(")[0] for caller, _ in bad) == [
        "masked_f32_avx2", "masked_f32_avx512"]
    assert all(target == LAMBDA for _, target in bad)


def test_plt_calls_and_calls_within_a_level_pass():
    text = disassembly(
        ("moe::(anonymous namespace)::rows_avx512(float*, long)",
         ["memcpy@plt", "moe::(anonymous namespace)::helper_avx512(float*)"]),
        ("moe::(anonymous namespace)::helper_avx512(float*)", []),
        ("moe::(anonymous namespace)::rows_avx2(float*, long)", ["memset@plt"]),
        ("moe::plain_function(float*)", ["moe::other(float*)"]),
    )
    bad, kernels = checker.out_of_level_calls(text)
    assert bad == []
    assert kernels == 3


def test_a_tail_call_is_named_and_a_jump_inside_the_function_is_not():
    kernel = "moe::(anonymous namespace)::masked_f32_avx512(float*, long, int, int, int, int)"
    text = (f"0000000000001000 <{kernel}>:\n"
            f"    1000:\tjne    1010 <{kernel}+0x10>\n"
            f"    1004:\tjmp    1008 <{kernel}+0x8>\n"
            f"    1008:\tjmp    2000 <{LAMBDA}>\n"
            f"\n0000000000002000 <{LAMBDA}>:\n"
            f"    2000:\tret\n")
    bad, kernels = checker.out_of_level_calls(text)
    assert kernels == 1
    assert bad == [(kernel, LAMBDA)]


def test_older_binutils_spellings_are_read():
    kernel = "moe::(anonymous namespace)::rows_avx2(float*, long)"
    text = (f"0000000000001000 <{kernel}>:\n"
            f"    1000:\tcallq  2000 <{LAMBDA}>\n"
            f"    1005:\tjmpq   2000 <{LAMBDA}>\n"
            f"\n0000000000002000 <{LAMBDA}>:\n"
            f"    2000:\tretq\n")
    bad, _ = checker.out_of_level_calls(text)
    assert bad == [(kernel, LAMBDA), (kernel, LAMBDA)]


def test_a_call_to_another_level_is_named():
    text = disassembly(
        ("moe::(anonymous namespace)::rows_avx512(float*, long)",
         ["moe::(anonymous namespace)::helper_avx2(float*)"]),
        ("moe::(anonymous namespace)::helper_avx2(float*)", []),
    )
    bad, _ = checker.out_of_level_calls(text)
    assert bad == [("moe::(anonymous namespace)::rows_avx512(float*, long)",
                    "moe::(anonymous namespace)::helper_avx2(float*)")]
