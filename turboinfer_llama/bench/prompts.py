"""The built-in prompt set: a short chat turn, a ~1,000-token summarisation, code and a
long generation, so prefill and decode, short and long contexts all appear."""

from __future__ import annotations

import json
from pathlib import Path

# A ~1,000-token article (about 960 gemma-3 tokens), written for this benchmark.
_ARTICLE = (
    "The town of Harwick sits where two rivers meet, and for most of its history the "
    "water that reached its kitchens came straight from the larger of the two. In the "
    "early years a single pumping house lifted river water into a brick reservoir on the "
    "hill above the market square, and gravity did the rest. The arrangement worked while "
    "the town stayed small. By the time the textile mills opened along the eastern bank, "
    "however, the reservoir emptied every summer afternoon, and the pressure in the upper "
    "streets fell so low that residents carried buckets from public taps. The council "
    "debated for a decade before it agreed to build a second reservoir, and even then the "
    "money came only after a dry summer left the hospital without water for three days.\n\n"
    "The second reservoir solved the pressure problem but created another. Water now sat "
    "for longer before anyone drank it, and in warm weather it grew green and smelled of "
    "earth. A young engineer named Mara Ellison, hired to inspect the pipes, argued that "
    "the town needed filtration rather than more storage. She built a small test bed of "
    "sand and gravel behind the pumping house and showed that water passed through it "
    "came out clear, even in August. The council was not convinced until a visiting "
    "physician linked a summer outbreak of stomach illness to the reservoir. Within two "
    "years Harwick had slow sand filters covering an area the size of four tennis courts, "
    "and the outbreaks stopped.\n\n"
    "For the next forty years the system changed little. The pipes aged, the filters were "
    "cleaned by hand every few weeks, and the pumps were replaced once when the old steam "
    "engines could no longer find spare parts. The trouble began again when the town grew "
    "toward the south, onto land higher than the reservoirs. Houses there received water "
    "only at night, when demand elsewhere dropped. The council first tried a booster "
    "pump, which helped until a storm cut power to the pumping house and the southern "
    "districts went dry for a week. After that, the town commissioned a water tower, "
    "painted pale blue, which is still the tallest structure in Harwick and appears on "
    "its postcards.\n\n"
    "Money has always shaped the choices. Every improvement was paid for by a mixture of "
    "water charges, loans and occasional grants from the regional government, and each of "
    "them arrived later than the engineers wanted. Records from the council archive show "
    "that the cost of the filters was repaid over thirty years, and the last payment on "
    "the water tower was made long after the engineer who designed it had retired. "
    "Residents have complained about their bills in almost every decade, yet surveys show "
    "they also rank clean water as the public service they value most, ahead of roads, "
    "schools and street lighting.\n\n"
    "The most recent chapter concerns leaks. A study five years ago estimated that nearly "
    "a quarter of the water the town treated never reached a tap; it seeped out of "
    "cracked mains, most of them laid before anyone alive today was born. Replacing every "
    "old pipe would cost more than the town spends on everything else in ten years. "
    "Instead, the utility installed acoustic sensors that listen for the hiss of escaping "
    "water at night, when the streets are quiet. Crews now repair the worst leaks first, "
    "and the share of lost water has fallen by about a third. The sensors also revealed "
    "something unexpected: several leaks were on private land, in pipes the utility did "
    "not own, which led to a long argument about who should pay for repairs.\n\n"
    "Climate has added a further pressure. The rivers run lower in late summer than they "
    "did a generation ago, and twice in the past decade the town has asked residents to "
    "stop watering gardens and washing cars. The utility is now studying whether to store "
    "winter flood water underground, in a layer of porous rock beneath the fields west of "
    "town, and pump it back up in dry months. Early tests are promising but slow, and the "
    "geology is not fully understood. Some residents worry about the effect on farms and "
    "wells nearby, while others argue that doing nothing is the riskier choice. The "
    "council has promised a public decision within two years, once the tests are complete "
    "and the costs are known.\n\n"
    "Through all of this, the daily work has stayed surprisingly similar. Operators still "
    "walk the filter beds each morning, take samples from taps across town and test them "
    "in a small laboratory beside the pumping house. The tests have become more "
    "sensitive, and the results now go to a public website within a day, but the routine "
    "would be familiar to Mara Ellison. Staff say the hardest part of the job is not "
    "technical at all: it is persuading people to care about a service that, when it "
    "works, is invisible. The utility runs tours for schoolchildren every spring, and the "
    "blue water tower opens to visitors once a year, when a long queue forms to climb its "
    "narrow stairs and look out over the rivers that have shaped the town for two "
    "centuries."
)

# What people use a small on-device model for: a short chat turn, a summary of a long
# text (a long prefill, so TTFT matters), code, and a long free generation.
BUILTIN_PROMPTS: tuple[str, ...] = (
    "Explain in two sentences why the sky is blue.",
    "Summarise the following article in three sentences.\n\n" + _ARTICLE + "\n\nSummary:",
    "Write a Python function that returns the n-th Fibonacci number iteratively, "
    "with a docstring and two doctests.",
    "Write a long story about a lighthouse keeper who finds a message in a bottle. "
    "Describe the island, the storm that follows and what the keeper decides to do.",
)


class PromptsError(ValueError):
    """The prompts file cannot be used."""


def load_prompts(path: str | Path | None) -> list[str]:
    """Prompts from a file: a JSON list of strings, or one prompt per non-empty line."""
    if path is None:
        return list(BUILTIN_PROMPTS)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptsError(f"prompts file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PromptsError(f"cannot read prompts file {p}: {e}") from e
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PromptsError(f"{p}: invalid JSON ({e.msg} at line {e.lineno})") from e
        if not isinstance(data, list) or not all(isinstance(x, str) and x.strip() for x in data):
            raise PromptsError(f"{p}: expected a JSON list of non-empty strings")
        prompts = data
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise PromptsError(f"{p}: no prompts in file")
    return prompts
