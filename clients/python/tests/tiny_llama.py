"""Builds the model the real-engine tests serve: no weights can be downloaded here, so a small
Llama-architecture model with random weights (fixed seed) and a byte-level BPE tokenizer trained
on generated text. The same command always writes the same files.

    python tiny_llama.py OUT_DIR

OUT_DIR then holds what ``vllm serve OUT_DIR`` (or ``LLM(model=OUT_DIR)``) loads:
``config.json``, ``model.safetensors``, ``tokenizer.json`` and its configs, and ``VERSION`` (a
digest of this file, so ``scripts/setup`` builds it again only when this file changes).

The weights are drawn wider than a trained model's (std 0.2, not 0.02), so the next-token
logits are spread out and greedy decoding does not hang on a near tie: the tests compare the
greedy tokens of a cached run with those of a recomputed one.
"""

import hashlib
import json
import os
import random
import sys
from pathlib import Path

#: model shape: 6 layers, hidden 512, 8 heads of 64 (all of them KV heads), about 21M parameters
LAYERS, HIDDEN, HEADS, KV_HEADS, INTERMEDIATE = 6, 512, 8, 8, 1376
VOCAB = 4096
MAX_LEN = 8192
SEED = 20261203

#: the generated corpus the tokenizer learns from: words of 2-9 letters, lines of 5-20 words
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _corpus(lines: int, rng: random.Random):
    words = ["".join(rng.choice(_LETTERS) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    for _ in range(lines):
        yield " ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) + "."


def _tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(20000, random.Random(SEED)), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "model_max_length": MAX_LEN,
                "add_bos_token": False,
            },
            indent=1,
        )
    )
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return tok.get_vocab_size()


def _model(out: Path, vocab: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_LEN,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)


def version() -> str:
    """A digest of this file: what was built changes only when it does."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    vocab = _tokenizer(out)
    _model(out, vocab)
    (out / "VERSION").write_text(version() + "\n")
    print(f"tiny_llama: wrote {out} ({vocab} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
