"""wfc.tasks.math_data: where GSM8K/SVAMP come from (path=, WFC_DATA_DIR, the hub) and what the examples hold."""

from __future__ import annotations

import json
import sys
import types

import pytest

from wfc.tasks.math import extract_number
from wfc.tasks.math_data import DATA_ENV, load_gsm8k, load_svamp

GSM8K_ROW = {"question": "Ann has 2 cats and 3 dogs. How many pets?", "answer": "2 + 3 = <<2+3=5>>5\n#### 5"}
SVAMP_ITEM = {"ID": "x", "Body": "Dan had $ 3 left", "Question": "How much?", "Answer": 1.0, "Type": "Subtraction"}


@pytest.fixture
def no_data_env(monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError


def write_gsm8k(folder, rows, split="train"):
    (folder / "gsm8k").mkdir(parents=True, exist_ok=True)
    path = folder / "gsm8k" / f"{split}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- the real files (WFC_DATA_DIR) ------------------------------------------------------------------------------


def test_gsm8k_from_data_dir(data_dir):
    train = load_gsm8k("train")
    test = load_gsm8k("test")
    assert (len(train), len(test)) == (7473, 1319)
    first = test[0]
    assert set(first.inputs().keys()) == {"question"}
    assert first.question.startswith("Janet")
    assert first.answer == "18"
    assert all(extract_number(ex.answer) is not None and "," not in ex.answer for ex in train + test)


def test_gsm8k_limit_keeps_a_prefix(data_dir):
    assert [e.question for e in load_gsm8k("test", limit=3)] == [e.question for e in load_gsm8k("test")[:3]]
    assert load_gsm8k("test", limit=0) == []


def test_svamp_from_data_dir(data_dir):
    items = load_svamp(path=data_dir)
    assert len(items) == 1000
    first = items[0]
    assert first.question == (
        "Each pack of dvds costs 76 dollars. If there is a discount of 25 dollars on each pack. "
        "How much do you have to pay to buy each pack?"
    )
    assert first.answer == "51"
    assert set(first.inputs().keys()) == {"question"}


def test_svamp_has_no_train_split():
    import inspect

    assert "split" not in inspect.signature(load_svamp).parameters


# --- resolution order ---------------------------------------------------------------------------------------------


def test_explicit_file_and_folder(tmp_path, no_data_env):
    path = write_gsm8k(tmp_path, [GSM8K_ROW])
    for source in (path, tmp_path, tmp_path / "gsm8k"):
        (ex,) = load_gsm8k("train", path=source)
        assert ex.question == GSM8K_ROW["question"] and ex.answer == "5"


def test_explicit_path_wins_over_env(tmp_path, monkeypatch):
    env_dir, own_dir = tmp_path / "env", tmp_path / "own"
    write_gsm8k(env_dir, [GSM8K_ROW])
    write_gsm8k(own_dir, [dict(GSM8K_ROW, answer="#### 7")])
    monkeypatch.setenv(DATA_ENV, str(env_dir))
    assert load_gsm8k("train")[0].answer == "5"
    assert load_gsm8k("train", path=own_dir)[0].answer == "7"


def test_explicit_path_without_the_data_is_an_error(tmp_path, no_data_env):
    with pytest.raises(FileNotFoundError, match="neither the data file nor a folder"):
        load_gsm8k("train", path=tmp_path)


def test_missing_data_names_both_remedies(no_data_env):
    with pytest.raises(FileNotFoundError) as info:
        load_gsm8k("test")
    message = str(info.value)
    assert "path=" in message and DATA_ENV in message and "datasets" in message
    with pytest.raises(FileNotFoundError, match=DATA_ENV):
        load_svamp()


def test_hub_fallback_through_datasets(monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)
    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if name == "ChilleD/SVAMP":
            return [dict(SVAMP_ITEM, Answer=float(split == "test"))]
        return [GSM8K_ROW]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert load_gsm8k("test")[0].answer == "5"
    assert [e.answer for e in load_svamp()] == ["0", "1"]  # train then test: all of SVAMP, for evaluation
    assert calls == [("openai/gsm8k", "main", "test"), ("ChilleD/SVAMP", None, "train"), ("ChilleD/SVAMP", None, "test")]


def test_hub_failure_is_caught_and_reported(monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)

    def load_dataset(*args, **kwargs):
        raise ConnectionError("no route to hub")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(FileNotFoundError, match="no route to hub"):
        load_gsm8k("train")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="split"):
        load_gsm8k("validation", path=tmp_path)
    with pytest.raises(ValueError, match="limit"):
        load_gsm8k("train", path=tmp_path, limit=-1)


def test_gsm8k_row_without_marker_is_a_data_error(tmp_path, no_data_env):
    write_gsm8k(tmp_path, [dict(GSM8K_ROW, answer="5")])
    with pytest.raises(ValueError, match="####"):
        load_gsm8k("train", path=tmp_path)
