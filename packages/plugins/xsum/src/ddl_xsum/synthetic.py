"""Generated "news" articles with one-sentence summaries: a learnable stand-in for XSum.

XSum (Narayan et al., EMNLP 2018) pairs a BBC article with its first sentence, which the
journalists wrote as a one-line summary: the task is to say *what happened, who did it,
where, how much*. The generator keeps that shape. Every article has hidden facts (an actor,
an action, a count, a kind of thing, a place, a day); one sentence of the article states
the event in one of several phrasings (active, passive, fronted place, "a total of"), and
the other sentences are distractors that reuse the same vocabulary in other roles (another
organisation declining to comment, residents of another town, other numbers). The summary
is a fixed function of the hidden facts:

    "<Actor> has <action> <count> <things> in <place>."

so a model must find the event sentence among the distractors and copy the right entity,
number and place into a fixed template. A small T5 learns the template within an epoch and
the copying over a few more, which is what the tiny preset's learnability check needs.
:func:`write_synthetic` saves such articles in XSum's on-disk layout, with a tokenizer
trained on them and T5 configs; it imports the Hugging Face libraries only when it runs
(and never torch), so the generator alone stays light.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

from ddl.contract import datafiles
from ddl.contract.errors import DataError
from ddl_xsum.data import (
    COLUMNS,
    MARKER,
    OFFLINE_VARS,
    SPLIT_SIZES,
    SYNTHETIC_TOKENIZER,
    T5_SHAPES,
    quiet_hf,
    t5_config,
    xsum_dir,
)

ACTORS = [
    "Northgate Council", "the Harbour Trust", "Alba Rail", "Westfield Housing",
    "the Forth Water Board", "Riverside Health", "Glenmore Estates", "the Valley Bus Company",
    "Carrick Energy", "the Northern Schools Trust", "Seaview Developments", "Kingsway Retail",
    "the Highland Parks Service", "Brightwater Homes", "Moorland Farms", "the City Library Group",
    "Tayside Transport", "Greenhill Clinics", "the Coastal Ferry Line", "Oakfield Builders",
]
ACTIONS = ["opened", "closed", "sold", "bought", "built", "repaired", "cancelled", "approved",
           "inspected", "upgraded"]
THINGS = ["schools", "bridges", "buses", "houses", "shops", "clinics", "trains", "parks",
          "libraries", "farms", "ferries", "stations"]
PLACES = ["Aberdeen", "Bristol", "Cardiff", "Dundee", "Exeter", "Leeds", "Inverness",
          "Swansea", "Belfast", "Perth", "York", "Bath", "Derry", "Oban", "Stirling", "Hull",
          "Carlisle", "Lincoln", "Norwich", "Wrexham", "Galway", "Ayr", "Durham", "Bangor"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
ADJECTIVES = ["wet", "cold", "bright", "windy", "mild", "grey"]
VERDICTS = ["overdue", "disappointing", "welcome", "surprising", "long awaited", "premature"]
PEOPLE = ["Ann Reid", "Tom Baxter", "Mairi Campbell", "Owen Price", "Siobhan Kelly", "Raj Patel",
          "Helen Ward", "Iain Munro"]

# The event sentence, in phrasings a summariser must all map to the same summary.
_EVENT = [
    "{Actor} {action} {count} {things} in {place} on {day}, officials confirmed.",
    "In {place}, {count} {things} were {action} by {actor} on {day}.",
    "A total of {count} {things} in {place} have now been {action} by {actor}.",
    "On {day}, {actor} {action} {count} {things} across {place}, a statement said.",
]
# Distractors reuse entities, places and numbers in roles that are not the event.
_DISTRACTORS = [
    "{Actor2} declined to comment on the decision.",
    "Residents in {place2} said they had waited {count2} years for news about {things2}.",
    "A spokesperson for {actor2} said further details would be published in {month}.",
    "The weather in {place2} was {adjective} for most of {day2}.",
    "Last year, {count2} people attended a public meeting in {place2}.",
    "Local councillor {person} described the move as {verdict}.",
    "{Actor2} is expected to report on {things2} in {place2} in {month}.",
    "It is the first such announcement since {month} {year}.",
]
SOURCE_PREFIX_WORDS = "summarize:"  # so a course preset's T5 prefix is a known token


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def summary_of(facts: dict[str, str]) -> str:
    """The reference summary: a fixed function of the article's hidden facts."""
    return f"{_cap(facts['actor'])} has {facts['action']} {facts['count']} {facts['things']} " \
           f"in {facts['place']}."


def article(rng: random.Random) -> dict[str, str]:
    """One record in XSum's schema: ``document``, ``summary``, ``id``."""
    actor, actor2 = rng.sample(ACTORS, 2)
    place, place2 = rng.sample(PLACES, 2)
    things, things2 = rng.sample(THINGS, 2)
    day, day2 = rng.sample(DAYS, 2)
    facts = {
        "actor": actor, "Actor": _cap(actor), "action": rng.choice(ACTIONS),
        "count": str(rng.randint(2, 99)), "things": things, "place": place, "day": day,
        "actor2": actor2, "Actor2": _cap(actor2), "place2": place2, "things2": things2,
        "count2": str(rng.randint(2, 99)), "day2": day2, "month": rng.choice(MONTHS),
        "year": str(rng.randint(1990, 2017)), "adjective": rng.choice(ADJECTIVES),
        "verdict": rng.choice(VERDICTS), "person": rng.choice(PEOPLE),
    }
    sentences = [rng.choice(_EVENT).format(**facts)]
    sentences += [t.format(**facts) for t in rng.sample(_DISTRACTORS, rng.randint(3, 6))]
    rng.shuffle(sentences)
    return {
        "document": "\n".join(sentences),  # XSum documents hold one sentence per line
        "summary": summary_of(facts),
        "id": str(rng.randint(10_000_000, 40_000_000)),  # BBC article ids are 8 digits
    }


def articles(n: int, seed: int) -> Iterator[dict[str, str]]:
    rng = random.Random(seed)
    for _ in range(n):
        yield article(rng)


# ---------------------------------------------------------------------------
# The synthetic set on disk
# ---------------------------------------------------------------------------


def _train_tokenizer(texts: list[str], out: Path) -> int:
    """A BPE tokenizer with T5's special tokens and conventions, trained on ``texts``.

    T5's SentencePiece vocabulary has <pad>=0, </s>=1, <unk>=2, marks word starts with "▁"
    (Metaspace) and appends </s> to every sequence; the decoder starts from <pad>
    (Raffel et al. 2020, sec. 2.1 and the released vocabulary). Saved with save_pretrained,
    so AutoTokenizer.from_pretrained(out) loads it like any hub tokenizer.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    # Punctuation split off words, so "Bristol." in a summary reuses the token of "Bristol".
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(),
                                                 pre_tokenizers.Punctuation()])
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, BpeTrainer(vocab_size=1000, min_frequency=2,
                                              special_tokens=["<pad>", "</s>", "<unk>"],
                                              show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=512)
    fast.save_pretrained(str(out))
    return len(fast)


def _synthetic_note(data_dir: Path, seed: int, sizes: dict[str, int], vocab: int) -> str:
    return (
        "This is NOT the real XSum data set, and there are no pretrained T5 weights here.\n"
        "\n"
        "The dataset is generated news-like articles with one-sentence summaries (see\n"
        "ddl_xsum.synthetic), saved with datasets' save_to_disk in XSum's schema (document,\n"
        "summary, id). The tokenizer is a BPE trained on these articles, not T5's\n"
        f"SentencePiece vocabulary ({vocab} tokens). models/synthetic-t5-*/ hold configs\n"
        "only: every preset trains its model from a random initialisation. Losses and\n"
        "ROUGE on this set say nothing about XSum.\n"
        "\n"
        "generator:   ddl_xsum.synthetic.write_synthetic\n"
        f"seed:        {seed}\n"
        + "".join(f"{split + ' size:':<13}{n}\n" for split, n in sizes.items())
        + "\nTo replace it with the real data, run on a machine with internet access:\n"
        f"  ddl prepare --plugin xsum --data-dir {data_dir}\n"
    )


def write_synthetic(data_dir: Path, sizes: dict[str, int] | None = None, seed: int = 0) -> Path:
    """Write the generated stand-in (dataset, tokenizer, model configs, marker); return the
    xsum directory. Deterministic for a seed; each split has its own random stream.
    Replaces an earlier synthetic set but refuses to touch real data."""
    data_dir = Path(data_dir)
    sizes = dict(SPLIT_SIZES if sizes is None else sizes)
    if set(sizes) != set(SPLIT_SIZES) or min(sizes.values()) < 1:
        raise DataError(f"synthetic xsum sizes must be positive for {', '.join(SPLIT_SIZES)} "
                        f"(got {sizes})")
    target = xsum_dir(data_dir)
    quiet_hf()
    for var in OFFLINE_VARS:  # nothing here needs the network
        os.environ[var] = "1"

    with datafiles.new_synthetic_set(target, "XSum") as new:
        import datasets

        splits = {split: list(articles(n, seed=seed * 1000 + i))
                  for i, (split, n) in enumerate(sizes.items())}
        features = datasets.Features({c: datasets.Value("string") for c in COLUMNS})
        ddict = datasets.DatasetDict({
            split: datasets.Dataset.from_dict({c: [r[c] for r in recs] for c in COLUMNS},
                                              features=features)
            for split, recs in splits.items()})
        ddict.save_to_disk(str(new / "dataset"))
        texts = [r[c] for r in splits["train"] for c in ("document", "summary")]
        vocab = _train_tokenizer(texts + [SOURCE_PREFIX_WORDS],
                                 new / "models" / SYNTHETIC_TOKENIZER)
        for model in T5_SHAPES:
            t5_config(model, vocab).save_pretrained(str(new / "models" / f"synthetic-{model}"))
        (new / MARKER).write_text(_synthetic_note(data_dir, seed, sizes, vocab))
    return target
