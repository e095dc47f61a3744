"""loopfuse-opt: pipelines, single-pass flags, stdin, -o, split input, diagnostics with lines."""
import io
import subprocess
import sys
import textwrap

import pytest
from jaxlib.mlir import ir

from loopfuse.diagnostics import opt as opt_module
from loopfuse.diagnostics.opt import main
from loopfuse.passes import PASSES, PassOptionError, RollLayers, Simplify

MODULE = textwrap.dedent("""\
    func.func @main(%w: tensor<4xf32> {loopfuse.state = "w"}, %x: tensor<4xf32>)
        -> (tensor<4xf32> {loopfuse.state = "w"}, tensor<4xf32> {loopfuse.unused}) {
      %0 = stablehlo.add %w, %x : tensor<4xf32>
      %1 = stablehlo.cosine %x : tensor<4xf32>
      return %0, %1 : tensor<4xf32>, tensor<4xf32>
    }
    """)


def opt(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "loopfuse.diagnostics.opt", *args], input=stdin, capture_output=True, text=True)


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


@pytest.mark.parametrize("pipeline, said", [
    ("canonicalize{max-iterations=x}", "failed to add `canonicalize` with options `max-iterations=x` (for the "
                                       "--max-iterations option: 'x' value invalid for long argument!)"),
    ("nope", "unknown pass")])
def test_a_bad_upstream_pass_is_one_error_before_any_chunk_runs(pipeline, said):
    """LLVM's option parser wrote its line to stderr bare, and each chunk of a split file failed apart."""
    r = opt("-", "--split-input-file", f"--pass-pipeline=builtin.module({pipeline})", stdin=MODULE + "// -----\n" + MODULE)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"loopfuse-opt: error: pass '{pipeline}': {said}" + (
        "" if said != "unknown pass" else r.stderr.strip().split(said, 1)[1])], r.stderr


def test_upstream_passes_mix_with_loopfuse_passes():
    r = opt("-", "--pass-pipeline=builtin.module(cse,alias-state)", stdin=MODULE)
    assert r.returncode == 0 and "tf.aliasing_output" in r.stdout



def opt_in_process(capsys, monkeypatch, *args, stdin: bytes = b""):
    """loopfuse-opt's main() in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse: --help
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_every_pass_with_summary_and_options(capsys, monkeypatch):
    code, out, _ = opt_in_process(capsys, monkeypatch, "--help")
    assert code == 0
    text = " ".join(out.split())  # argparse rewraps lines
    for name, cls in PASSES.items():
        assert f"--{name}" in text and " ".join(cls.summary.split()) in text
        for f in cls.options():
            assert f"{f.name.replace('_', '-')}=<{f.type.__name__}> (default {f.default}" in text
            assert " ".join(f.metadata["help"].split()) in text


def test_pass_failure_in_a_chunk_without_location_names_the_chunks_first_line(capsys, monkeypatch):
    """A failure with no location of its own: an unknown pass let through to run time (parsing refuses it now)."""
    monkeypatch.setattr(opt_module, "_checked", lambda spec: spec)
    text = MODULE + "// -----\n\n" + MODULE
    code, _, err = opt_in_process(capsys, monkeypatch, "-", "--split-input-file",
                                  "--pass-pipeline=builtin.module(no-such-pass)", stdin=text.encode())
    second = len(MODULE.splitlines()) + 2  # the line after the marker
    assert code == 1
    assert err.splitlines() == [f"<stdin>:{n}: error: pass 'no-such-pass' failed: unknown pass (loopfuse passes: "
                                "alias-state, cond-to-select, drop-unused-outputs, flatten-update, fold-init, fold-slices, "
                                "micro-batch, pack-state, roll-layers, "
                                "simplify, wrap-loop; others "
                                "come from MLIR's registry)" for n in (1, second)]


BAD_UTF8 = MODULE.encode().replace(b"tensor<4xf32>", b"tensor<4xf32\xff>", 1)


@pytest.mark.parametrize("case", ["missing-input", "utf8-file", "utf8-stdin", "utf8-reproducer", "unwritable-output"])
def test_bad_files_are_one_error_line_and_exit_1(case, tmp_path, capsys, monkeypatch):
    path, stdin, args = tmp_path / "in.mlir", b"", ["--alias-state"]
    if case == "missing-input":
        expected = f"{path}: error: cannot read the input: No such file or directory"
    elif case == "unwritable-output":
        path.write_text(MODULE)
        args += ["-o", str(tmp_path / "no-such-dir" / "out.mlir")]
        expected = f"{tmp_path / 'no-such-dir' / 'out.mlir'}: error: cannot write the output: No such file or directory"
    else:
        header = b"// loopfuse-pipeline: builtin.module(alias-state)\n" if case == "utf8-reproducer" else b""
        args = ["--reproducer"] if case == "utf8-reproducer" else args
        if case == "utf8-stdin":
            path, stdin = "-", BAD_UTF8
        else:
            path.write_bytes(header + BAD_UTF8)
        expected = f"{'<stdin>' if stdin else path}:{1 + bool(header)}:33: error: the input is not UTF-8 text (byte 0xff)"
    code, out, err = opt_in_process(capsys, monkeypatch, str(path), *args, stdin=stdin)
    assert (code, out, err.splitlines()) == (1, "", [expected])


@pytest.mark.parametrize("depth, opener", [(10_000, "module {"), (100_000, "module {"), (100_000, "tuple<")])
def test_deep_nesting_is_refused_not_a_crash(depth, opener):
    """Run as a process: the MLIR parser overflows its stack (SIGSEGV) from ~4,000 nested modules."""
    if opener == "module {":
        text = opener * depth + "}" * depth
    else:
        text = "func.func @main(%a: " + opener * depth + "tensor<f32>" + ">" * depth + ") {\n  return\n}\n"
    r = subprocess.run([sys.executable, "-m", "loopfuse.diagnostics.opt", "-", "--alias-state"], input=text, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.returncode  # a crash would be a negative signal number
    assert r.stderr.splitlines() == ["<stdin>:1: error: nesting deeper than 1000 levels of brackets (regions, types, "
                                     "attributes): refused before parsing"]


def test_nesting_within_the_limit_still_parses(capsys, monkeypatch):
    text = "module {" * 900 + "}" * 900
    code, out, err = opt_in_process(capsys, monkeypatch, "-", "--pass-pipeline=builtin.module(cse)",
                                    stdin=text.encode())
    assert code == 0 and out.count("module {") == 900, err


@pytest.mark.parametrize("pipeline", ["snapshot-op-locations{{filename={out}}}", "inline{{default-pipeline=cse}}"])
def test_reproducer_replays_no_pass_with_effects_outside_the_module(pipeline, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    repro = tmp_path / "reproducer.mlir"
    repro.write_text(f"// loopfuse-pipeline: builtin.module(alias-state,{pipeline.format(out=tmp_path / 'x.mlir')})\n"
                     + MODULE)
    code, out, err = opt_in_process(capsys, monkeypatch, "--reproducer", str(repro))
    assert (code, out) == (1, "")
    [line] = err.splitlines()
    assert line.startswith(f"{repro}: error: the reproducer's pipeline names '{pipeline.split('{{')[0]}")
    assert "--reproducer does not replay" in line
    assert list(tmp_path.iterdir()) == [repro]  # nothing written


def test_reproducer_replays_loopfuse_and_allowlisted_upstream_passes(tmp_path, capsys, monkeypatch):
    repro = tmp_path / "reproducer.mlir"
    repro.write_text(f"// loopfuse-pipeline: builtin.module(drop-unused-outputs,canonicalize,cse,alias-state)\n{MODULE}")
    code, out, err = opt_in_process(capsys, monkeypatch, "--reproducer", str(repro))
    assert code == 0, err
    assert "tf.aliasing_output = 0" in out and "cosine" not in out


def test_loopfuse_opt_runs_without_importing_jax(module_file):
    """The tool needs only the pass library and MLIR: it starts in a fraction of jax's import time."""
    code = ("import sys\nfrom loopfuse.diagnostics.opt import main\n"
            f"assert main(['--simplify', {str(module_file)!r}]) == 0\n"
            "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax.'))[:5]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("case", ["parse-error-in-place", "pass-failure", "failing-chunk"])
def test_a_failed_run_leaves_the_output_file_as_it_was(case, tmp_path, capsys, monkeypatch):
    source, out = tmp_path / "in.mlir", tmp_path / "out.mlir"
    out.write_text("previous result\n")
    if case == "parse-error-in-place":
        source.write_text(MODULE.replace("tensor<4xf32>)", "tensor<4xf32)", 1))
        out, args = source, ["--alias-state"]
    elif case == "pass-failure":  # the module has no @loopfuse_init
        source.write_text(MODULE)
        args = ["--fold-init"]
    else:
        source.write_text(MODULE + "// -----\nfunc.func @main( {\n")
        args = ["--split-input-file", "--alias-state"]
    before = out.read_text()
    code, stdout, err = opt_in_process(capsys, monkeypatch, str(source), *args, "-o", str(out))
    assert code == 1 and stdout == "" and "error:" in err
    assert out.read_text() == before


def test_a_bad_command_line_exits_1_with_the_usage(capsys, monkeypatch):
    code, out, err = opt_in_process(capsys, monkeypatch, "--no-such-flag", "-")
    assert (code, out) == (1, "")
    assert err.startswith("usage: loopfuse-opt ") and err.endswith("loopfuse-opt: error: unrecognized arguments: "
                                                                   "--no-such-flag\n")


@pytest.mark.parametrize("options, problem", [
    ("wrap-loop{steps=3 steps=4}", "option 'steps': given more than once"),
    ("wrap-loop{steps= 3}", "option 'steps': no spaces around '=' (write steps=3)"),
    ("wrap-loop{rows=1 steps =3}", "option 'steps': no spaces around '=' (write steps=3)"),
    ("wrap-loop{steps = 3}", "option 'steps': no spaces around '=' (write steps=3)"),
    ("roll-layers{memory-budget=nan}", "option 'memory-budget': expects a number, got nan"),
    ("roll-layers{memory-budget=-nan}", "option 'memory-budget': expects a number, got nan"),
])
def test_a_bad_option_is_one_error_naming_it(options, problem, capsys, monkeypatch):
    code, out, err = opt_in_process(capsys, monkeypatch, "-", f"--pass-pipeline=builtin.module({options})",
                                    stdin=MODULE.encode())
    assert (code, out, err) == (1, "", f"loopfuse-opt: error: pass '{options.split('{')[0]}' {problem}\n")


def test_options_may_be_separated_by_several_spaces(capsys, monkeypatch):
    code, out, err = opt_in_process(capsys, monkeypatch, "-", "--pass-pipeline=builtin.module(wrap-loop{ steps=3   rows=2 })",
                                    stdin=MODULE.encode())
    assert code == 0, err
    assert "tensor<3x4xf32>" in out  # the history of the unused output: 3 steps


def test_a_nan_option_is_refused_from_python_too():
    with pytest.raises(PassOptionError, match="option 'memory-budget': expects a number, got nan"):
        RollLayers(memory_budget=float("nan"))


def test_a_main_without_a_body_is_an_error_at_main(capsys, monkeypatch):
    text = ('// a declaration only\n'
            'func.func private @main(%a: tensor<3xf32> {loopfuse.state = "w"}) -> (tensor<3xf32> {loopfuse.state = "w"})\n')
    code, out, err = opt_in_process(capsys, monkeypatch, "-", "--wrap-loop", stdin=text.encode())
    assert (code, out) == (1, "")
    assert err == ("<stdin>:2:1: error: pass 'wrap-loop' failed: @main is a declaration without a body: "
                   "loopfuse's passes need the step's body\n")


def _parses_a_bad_type(self, module_op):
    ir.Type.parse("tensor<3x\n-5xf32>")  # an MLIRError whose own text has lines and a location


def _casts_wrongly(self, module_op):
    ir.StringAttr(ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 7))


@pytest.mark.parametrize("apply, message", [
    (_parses_a_bad_type, "Unable to parse type: expected non-function type (unexpected MLIRError)"),
    (_casts_wrongly, "Cannot cast attribute to StringAttr (from Attribute(7 : i32)) (unexpected ValueError)"),
])
def test_an_unexpected_exception_in_a_pass_is_one_line_naming_the_pass(apply, message, capsys, monkeypatch):
    monkeypatch.setattr(Simplify, "apply", apply)
    code, out, err = opt_in_process(capsys, monkeypatch, "-", "--simplify", stdin=MODULE.encode())
    assert (code, out) == (1, "")
    assert err == f"<stdin>:1: error: pass 'simplify' failed: {message}\n"
