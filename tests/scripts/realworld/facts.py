"""The one line every real-world script prints on each rank when it ends well, so a test can
hold ddptui's record against the script's own count (imported by bare name, like datautils)."""

import sys


def report(rank, world, steps, last_loss, epoch_steps, **extra):
    """``REALWORLD rank=R world=W steps=N last_loss=<repr> epoch_steps=E:N,... k=v ...``.

    ``epoch_steps`` maps each ``set_epoch`` value (in order) to the optimizer steps taken in it;
    ``last_loss`` is the value of the last loss ``backward()`` was called on, at full precision.
    """
    epochs = ",".join(f"{epoch}:{count}" for epoch, count in epoch_steps.items())
    fields = [f"rank={rank}", f"world={world}", f"steps={steps}", f"last_loss={last_loss!r}"]
    fields.append(f"epoch_steps={epochs}")
    fields += [f"{key}={value!r}" for key, value in extra.items()]
    # One write, its newline in it: print() writes the text and the newline apart, and an
    # unbuffered stream shared with another process (two workers of one launched rank, in
    # one log) took that one's ": " between them, and the line ended "start_method='fork':".
    sys.stdout.write("REALWORLD " + " ".join(fields) + "\n")
    sys.stdout.flush()
