"""Offline datasets: the four shapes from JSONL and Parquet, forced shapes, the no-match error,
tokenisation (BOS-prefixed prompt, EOS-terminated completion) and the batch layout."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrft.consumers.offline import batches
from streamrft.consumers.offline_data import collate_sequences, load_offline_dataset, render_messages
from streamrft.engine.models import build_char_tokenizer
from streamrft.producers.synthetic import ALPHABET


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer(ALPHABET)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_dpo_pairs(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "rev abc=", "chosen": "cba", "rejected": "abc"}])
    ds = load_offline_dataset(path, tokenizer)
    (ex,) = ds.examples
    assert ds.shape == "dpo" and ex.label is None
    assert ex.prompt_ids[0] == tokenizer.bos_token_id and tokenizer.decode(ex.prompt_ids[1:]) == "rev abc="
    assert ex.completion_ids[-1] == ex.rejected_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ex.completion_ids[:-1]) == "cba" and tokenizer.decode(ex.rejected_ids[:-1]) == "abc"


def test_kto_from_parquet(tmp_path, tokenizer):
    from datasets import Dataset

    path = tmp_path / "k.parquet"
    Dataset.from_list([{"prompt": "rev ab=", "completion": "ba", "label": True},
                       {"prompt": "rev ab=", "completion": "ab", "label": False}]).to_parquet(str(path))
    ds = load_offline_dataset(path, tokenizer)
    assert ds.shape == "kto" and [e.label for e in ds.examples] == [True, False]


def test_sft_and_forced_shape(tmp_path, tokenizer):
    rows = [{"prompt": "rev ab=", "completion": "ba", "label": True}]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    assert load_offline_dataset(path, tokenizer).shape == "kto"  # detected: the label column wins
    forced = load_offline_dataset(path, tokenizer, shape="sft")
    assert forced.shape == "sft" and forced.examples[0].label is None
    with pytest.raises(ValueError, match="columns .*'completion'.*dpo: prompt/chosen/rejected"):
        load_offline_dataset(path, tokenizer, shape="dpo")


def test_chat_messages_plain_join(tmp_path, tokenizer):
    chat = [{"role": "system", "content": "be"}, {"role": "user", "content": "rev ab="},
            {"role": "assistant", "content": "ba"}]
    assert render_messages(chat, tokenizer) == ("system: be\nuser: rev ab=\nassistant: ", "ba")
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": chat}])
    ds = load_offline_dataset(path, tokenizer)
    assert ds.shape == "chat" and tokenizer.decode(ds.examples[0].completion_ids[:-1]) == "ba"


def test_chat_messages_use_the_chat_template(tokenizer):
    templated = build_char_tokenizer(ALPHABET)
    templated.chat_template = "{% for m in messages %}[{{ m.content }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    chat = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
            {"role": "user", "content": "z"}, {"role": "assistant", "content": "w"}]
    assert render_messages(chat, templated) == ("[x][y][z]>", "w")
    with pytest.raises(ValueError, match="assistant"):
        render_messages(chat[:1], tokenizer)


def test_unknown_columns_name_the_file_and_columns(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "tasks.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(ValueError, match=r"tasks\.jsonl: columns \['answer', 'question'\] match no offline data shape"):
        load_offline_dataset(path, tokenizer)


def test_collate_masks_exactly_the_completion():
    seqs = collate_sequences([([1, 7, 8], [9, 2]), ([1, 7], [5, 6, 2])], pad_id=0)
    assert seqs.input_ids.tolist() == [[1, 7, 8, 9, 2], [1, 7, 5, 6, 2]]
    targets = seqs.input_ids[:, 1:]
    assert targets[0][seqs.mask[0] > 0].tolist() == [9, 2]
    assert targets[1][seqs.mask[1] > 0].tolist() == [5, 6, 2]
    seqs = collate_sequences([([1, 7], [2]), ([1, 7, 8, 8], [9, 2])], pad_id=0)
    assert seqs.attention_mask.tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]
    assert seqs.mask.tolist()[0] == [0, 1, 0, 0, 0]


def test_batches_cycle_epochs_and_are_seeded():
    a, b = batches(5, 3, seed=1), batches(5, 3, seed=1)
    first = [next(a) for _ in range(5)]
    assert first == [next(b) for _ in range(5)]
    flat = sum(first, [])
    assert sorted(flat[:5]) == sorted(flat[5:10]) == list(range(5))  # every epoch sees each example once
    assert flat[:5] != flat[5:10] or flat[5:10] != flat[10:15]  # and is reshuffled
