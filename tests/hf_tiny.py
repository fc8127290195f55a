"""Tiny transformers models with tokenizers trained here (no downloads), saved with save_pretrained beside each
other: the models `attncli capture` is tested on (tests/test_capture.py). Parameters are randomised
(hf_random.randomise) so that a dropped norm weight or bias shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CORPUS = [
    "The cat drank the milk because it was sweet",
    "The cat drank the milk because it was hungry",
    "the dog ate the bone and it was happy",
    "a bird sang in the tree while the sun rose",
    "le chat a bu le lait",
    "once upon a time there was a small model",
]


def word_level(specials: list[str], template: str | None, pair: str | None = None) -> Any:
    """A word-level tokenizer trained on CORPUS (whitespace split), with ``template`` around each text
    (e.g. '<s> $A' or '[CLS] $A [SEP]')."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()  # joins words with spaces; one word alone is itself
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=specials))
    if template is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=template, pair=pair or f"{template} $B:1",
            special_tokens=[(s, tok.token_to_id(s)) for s in specials if s in template])
    return tok


def byte_level() -> Any:
    """A byte-level BPE tokenizer (GPT-2's scheme: 'Ġcat' is ' cat') trained on CORPUS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def save(model: Any, tokenizer: Any, folder: Path, **special: str) -> Path:
    from hf_random import randomise
    from transformers import PreTrainedTokenizerFast

    randomise(model)
    model.eval()
    model.save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special).save_pretrained(folder)
    return folder


def llama(folder: Path, dtype: str | None = None) -> Path:
    """A Llama-like decoder with grouped-query heads (4 query heads, 2 K/V heads), RoPE; '<s>' before each text."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = word_level(["[PAD]", "[UNK]", "<s>", "</s>"], "<s> $A")
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rope_theta=10000.0,
                      bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"),
                      pad_token_id=tok.token_to_id("[PAD]"), tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    return save(model, tok, folder, pad_token="[PAD]", unk_token="[UNK]", bos_token="<s>", eos_token="</s>")


def gpt2(folder: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = byte_level()
    eos = tok.token_to_id("<|endoftext|>")
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                     bos_token_id=eos, eos_token_id=eos)
    return save(GPT2LMHeadModel(cfg), tok, folder, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                pad_token="<|endoftext|>")


def bert(folder: Path) -> Path:
    from transformers import BertConfig, BertModel

    tok = word_level(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS] $A [SEP]")
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=64, pad_token_id=0)
    return save(BertModel(cfg), tok, folder, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                sep_token="[SEP]", mask_token="[MASK]")


def bart(folder: Path) -> Path:
    from transformers import BartConfig, BartForConditionalGeneration

    tok = word_level(["<pad>", "[UNK]", "<s>", "</s>"], "<s> $A </s>")
    cfg = BartConfig(vocab_size=tok.get_vocab_size(), d_model=32, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                     max_position_embeddings=64, pad_token_id=tok.token_to_id("<pad>"),
                     bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"),
                     decoder_start_token_id=tok.token_to_id("</s>"), forced_eos_token_id=None)
    return save(BartForConditionalGeneration(cfg), tok, folder, pad_token="<pad>", unk_token="[UNK]",
                bos_token="<s>", eos_token="</s>")


def t5(folder: Path) -> Path:
    from transformers import T5Config, T5ForConditionalGeneration

    tok = word_level(["<pad>", "</s>", "[UNK]"], "$A </s>")
    cfg = T5Config(vocab_size=tok.get_vocab_size(), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                   num_heads=4, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
                   decoder_start_token_id=0)
    return save(T5ForConditionalGeneration(cfg), tok, folder, pad_token="<pad>", eos_token="</s>", unk_token="[UNK]")
