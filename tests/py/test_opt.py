"""loopfuse-opt: pipelines, single-pass flags, stdin, -o, split input, diagnostics with lines."""
import subprocess
import sys
import textwrap

import pytest

MODULE = textwrap.dedent("""\
    func.func @main(%w: tensor<4xf32> {loopfuse.state = "w"}, %x: tensor<4xf32>)
        -> (tensor<4xf32> {loopfuse.state = "w"}, tensor<4xf32> {loopfuse.unused}) {
      %0 = stablehlo.add %w, %x : tensor<4xf32>
      %1 = stablehlo.cosine %x : tensor<4xf32>
      return %0, %1 : tensor<4xf32>, tensor<4xf32>
    }
    """)


def opt(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "loopfuse.opt", *args], input=stdin, capture_output=True, text=True)


@pytest.fixture
def module_file(tmp_path):
    path = tmp_path / "in.mlir"
    path.write_text(MODULE)
    return path


def test_pipeline_and_single_flags_agree(module_file):
    a = opt(str(module_file), "--pass-pipeline=builtin.module(drop-unused-outputs,alias-state)")
    b = opt(str(module_file), "--drop-unused-outputs", "--alias-state")
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout
    assert "tf.aliasing_output = 0" in a.stdout and "cosine" not in a.stdout


def test_stdin_and_output_file(tmp_path):
    out = tmp_path / "out.mlir"
    r = opt("-", "--alias-state", "-o", str(out), stdin=MODULE)
    assert r.returncode == 0 and r.stdout == ""
    assert "tf.aliasing_output" in out.read_text()


def test_split_input_file_reports_lines_in_the_whole_file():
    text = MODULE + "// -----\n" + "func.func @main(%a: tensor<2xf32>) {\n  %0 = stablehlo.add %a %a : tensor<2xf32>\n  return\n}\n"
    r = opt("-", "--split-input-file", "--alias-state", stdin=text)
    assert r.returncode != 0
    bad_line = text.splitlines().index("  %0 = stablehlo.add %a %a : tensor<2xf32>") + 1
    assert f"<stdin>:{bad_line}:" in r.stderr and "expected ','" in r.stderr
    assert "tf.aliasing_output" in r.stdout  # the good chunk before it is still processed and printed


def test_bad_pipeline_and_unknown_pass_fail():
    assert opt("-", "--pass-pipeline=builtin.module(alias-state{x})", stdin=MODULE).returncode != 0
    r = opt("-", "--pass-pipeline=builtin.module(nope)", stdin=MODULE)
    assert r.returncode != 0 and "unknown pass" in r.stderr


def test_upstream_passes_mix_with_loopfuse_passes():
    r = opt("-", "--pass-pipeline=builtin.module(cse,alias-state)", stdin=MODULE)
    assert r.returncode == 0 and "tf.aliasing_output" in r.stdout
