import json

import numpy as np
import pytest

from predictor.artifact import default_artifact_path, load_artifact, save_artifact
from predictor.exceptions import ArtifactError
from predictor.learned import LearnedPredictor
from predictor.measurements import load_measurements
from predictor.spec import parse_spec
from predictor.tiered import TieredPredictor


@pytest.fixture(scope="module")
def model():
    return LearnedPredictor(n_splits=3).fit(load_measurements())


def test_round_trip_predicts_identically(model, tmp_path):
    path = save_artifact(model, tmp_path / "m.json")
    doc = json.loads(path.read_text())
    assert doc["training_data_hash"] == model.data_hash_
    assert doc["version"] == model.version_ and doc["feature_names"]
    loaded = load_artifact(path)
    specs = [parse_spec({"model": "llama-3.1-8b", "task": "lora"})]
    a, b = model.predict_table(specs), loaded.predict_table(specs)
    np.testing.assert_allclose(a.peak_vram_upper_gib, b.peak_vram_upper_gib, rtol=1e-5)
    np.testing.assert_allclose(a.runtime_s, b.runtime_s)


def test_bad_artifacts_raise_artifact_error(tmp_path):
    with pytest.raises(ArtifactError, match="snugfit train"):
        load_artifact(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something-else"}')
    with pytest.raises(ArtifactError):
        load_artifact(bad)
    bad.write_text("not json")
    with pytest.raises(ArtifactError):
        load_artifact(bad)


def test_shipped_artifact_answers_through_the_tiered_predictor():
    assert default_artifact_path().exists()
    tp = TieredPredictor.default()
    preds = tp.predict([parse_spec({"model": "llama-3.1-8b", "task": "inference"})])
    assert len(preds) == 5
    assert preds[0].method.startswith("learned:")
    assert preds[0].peak_vram_upper_gib >= preds[0].peak_vram_gib
