"""Training scripts as the workers of a cluster brought up by
scripts/launch.sh from a config (worker.command), as a user runs it."""

import json
import os
import re
import shutil
import subprocess

import pytest

pytest.importorskip("torch", reason="python3-torch not installed (install-deps.sh --test)")

from conftest import BIN, FMNIST, ROOT, port_base  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir(FMNIST),
                                reason="dataset-fashion-mnist not installed")


def torch_config(tmp_path, command=None, records=6400, name="torch", example="fmnist_mlp.py"):
    """conf/<name>.yaml for one short epoch on free ports, in tmp_path."""
    with open(os.path.join(ROOT, "conf", name + ".yaml")) as f:
        text = f.read()
    text = re.sub(r"(?m)^  epochs: \d+", "  epochs: 1", text)
    text = re.sub(r"(?m)^  task_records: \d+", "  task_records: 640\n  train_limit: %d" % records,
                  text)
    text = re.sub(r"(?m)^  dir: .*", "  dir: %s" % (tmp_path / "checkpoints"), text)
    base = port_base()
    for key, off in (("master", 0), ("master_http", 1), ("pserver", 10), ("pserver_data", 20),
                     ("pserver_http", 30), ("worker_http", 40)):
        text = re.sub(r"(?m)^    %s: \d+" % key, "    %s: %d" % (key, base + off), text)
    if command is not None:
        text = re.sub(r"(?m)^  command: .*", "  command: [%s]" % ", ".join(command), text)
    # As in a repository: conf/torch.yaml beside examples/, the command's
    # relative path found from the config's parent directory (whatever the
    # working directory: launch() runs in conf/).
    (tmp_path / "conf").mkdir()
    (tmp_path / "examples" / "torch").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "examples", "torch", example),
                tmp_path / "examples" / "torch" / example)
    path = tmp_path / "conf" / (name + ".yaml")
    path.write_text(text)
    return str(path)


def launch(config, tmp_path):
    run = tmp_path / "run"
    r = subprocess.run([os.path.join(ROOT, "scripts", "launch.sh"), "run", "--config", config,
                        "--hosts", os.path.join(ROOT, "conf", "hosts.local"), "--run-dir", str(run),
                        "--quiet"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, STRATA_BIN_DIR=BIN), cwd=str(tmp_path / "conf"))
    summary = run / "summary.json"
    assert summary.exists(), "launch.sh wrote no summary:\n" + r.stdout + r.stderr
    with open(summary) as f:
        return r, json.load(f), run


def test_launch_runs_the_configs_training_scripts(tmp_path):
    r, summary, run = launch(torch_config(tmp_path), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary["state"] == "succeeded"
    assert summary["final_test_accuracy"] > 0.7
    for i in (0, 1):
        log = (run / "logs" / ("worker-%d.log" % i)).read_text()
        assert "running the training script /usr/bin/python3 " in log
        assert str(tmp_path / "examples" / "torch" / "fmnist_mlp.py") in log


def test_a_script_that_raises_is_restarted_and_its_task_requeued(tmp_path):
    script = os.path.join(ROOT, "tests", "python", "crash_once.py")
    r, summary, run = launch(torch_config(tmp_path, ["/usr/bin/python3", script]), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary["state"] == "succeeded"
    assert summary["tasks_requeued"] >= 1
    log = (run / "logs" / "worker-0.log").read_text()
    assert "Traceback (most recent call last)" in log
    assert "RuntimeError: a crash for the test" in log
    assert "worker-0 failed" in r.stdout + r.stderr


def test_a_pipeline_whose_second_stage_dies_mid_step_goes_on(tmp_path):
    """conf/torch-pipeline.yaml (2 stages of an nn.Sequential) through
    launch.sh, its second stage's script killed in the middle of a step:
    restarted by the launcher, it takes stage 1 again, the first stage
    tries the step again on it, and the job reaches 0.7."""
    script = os.path.join(ROOT, "tests", "python", "crash_stage_once.py")
    r, summary, run = launch(torch_config(tmp_path, ["/usr/bin/python3", script],
                                          name="torch-pipeline", example="fmnist_pipeline.py"),
                             tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary["state"] == "succeeded", summary
    assert summary["final_test_accuracy"] > 0.7, summary
    logs = [(run / "logs" / ("worker-%d.log" % i)).read_text() for i in (0, 1)]
    assert "stage 1 dies mid-step" in logs[1]
    assert logs[1].count("pipeline: stage 1 of 2 (modules 2..4, tables 2..5)") >= 2, logs[1][-3000:]
    assert re.search(r"pipeline: step \d+ failed .*; trying it again once the group is whole",
                     logs[0]), logs[0][-3000:]


def test_every_shipped_config_validates():
    """conf/*.yaml (the README's and the examples' configs) pass `strata
    validate --offline` against conf/hosts.local."""
    confs = sorted(f for f in os.listdir(os.path.join(ROOT, "conf")) if f.endswith(".yaml"))
    assert "torch-cnn.yaml" in confs and "torch-dlrm.yaml" in confs
    for name in confs:
        r = subprocess.run([os.path.join(BIN, "strata"), "validate", "--config",
                            os.path.join(ROOT, "conf", name), "--hosts",
                            os.path.join(ROOT, "conf", "hosts.local"), "--offline"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, name + ":\n" + r.stdout + r.stderr
