"""`chainweaver migrate` through the installed entry point: the corpus converts, the
report names every left-out field, and `chainweaver run` runs the converted flows with
the results the reference package gave."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "migrate_corpus"
EXPECTED = json.loads((HERE / "migrate_corpus_expected.json").read_text())
BIN = Path(sys.executable).parent
CHAINWEAVER = shutil.which("chainweaver", path=str(BIN)) or str(BIN / "chainweaver")
WRITTEN = ["label_wrapper.flow.json", "order_label.flow.yaml", "refund_case.flow.yaml",
           "routing.flow.json"]
LEFT_OUT = 16  # fields the corpus holds that ChainWeaver cannot express


def test_the_installed_command_converts_the_corpus_and_the_flows_run(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}  # tests/: support.migrate_corpus
    out = tmp_path / "out"
    done = subprocess.run([CHAINWEAVER, "migrate", str(CORPUS), "--out", str(out)],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 1, done.stderr
    assert sorted(p.name for p in out.iterdir()) == WRITTEN
    reported = [line for line in done.stderr.splitlines()
                if line.startswith(str(CORPUS)) and ": not written: " not in line]
    assert len(reported) == LEFT_OUT, done.stderr
    assert done.stderr.splitlines()[-1] == (f"chainweaver migrate: 4 of 8 file(s) written "
                                            f"to {out}")
    tools = tmp_path / "corpus_tools.py"
    tools.write_text("from support.migrate_corpus import chainweaver_tools\n\n"
                     "globals().update({t.name: t for t in chainweaver_tools()})\n")
    for case in EXPECTED:
        ran = subprocess.run(
            [CHAINWEAVER, "run", case["flow"], str(out), "--tools", str(tools),
             "--input", json.dumps(case["input"])],
            capture_output=True, text=True, env=env, check=False)
        assert ran.returncode == 0, ran.stderr
        output = json.loads(ran.stdout)
        reference = case["reference_output"]
        assert output and output == {k: reference[k] for k in output}


def test_model_modules_import_from_the_current_folder_as_for_every_command(
    tmp_path: Path,
) -> None:
    # The reference flow's models live in a package of the folder migrate runs in, as
    # `serve`, `run` and `inspect` find them.
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "models.py").write_text(
        "from support.migrate_corpus import RouteSummary\n")
    source = json.loads((CORPUS / "routing.flow.json").read_text())
    source["output_schema_ref"] = "shop.models:RouteSummary"
    (tmp_path / "routing.json").write_text(json.dumps(source))
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}  # tests/: support.migrate_corpus
    done = subprocess.run([CHAINWEAVER, "migrate", "routing.json", "--out", "out"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "routing.flow.json").is_file()
