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
Nothing here imports torch or Hugging Face libraries.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

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
