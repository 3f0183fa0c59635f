"""What a user's console shows around each DataFrame action (issue 56), read from a driver's output: the driver
prints ``<<ACTION label>>`` before each action, then ``label -> <result>``; ``<<ACTIONS END>>`` after the last one,
then stops Spark and prints ``<<STOPPED>>``."""


def assert_each_action_printed_its_own_output(out: str, actions: int) -> None:
    """Each of the ``actions`` sections holds its own result line (and, for ``show``, its table) and nothing else,
    Spark's own stage bar aside (a plain PySpark job shows it too); nothing follows ``spark.stop()``."""
    sections = out.split("<<ACTIONS END>>")[0].split("<<ACTION ")[1:]
    assert len(sections) == actions, out[-3000:]
    for section in sections:
        head, *body = [line for line in section.replace("\r", "\n").split("\n")
                       if line.strip() and not line.startswith("[Stage ")]
        label = head.rstrip(">")
        name = label.split(" ")[-1]
        mine = [line for line in body if line.startswith(f"{label} -> ")]
        table = [line for line in body if name == "show" and (line[:1] in "+|" or line == "only showing top 2 rows")]
        stray = [line for line in body if line not in mine + table]
        assert name != "show" or len(table) == 7, body  # three rules, the header, 2 rows and the footer
        assert len(mine) == 1 and not stray, (label, body)
    stopped = out.split("<<ACTIONS END>>")[1]
    assert stopped.strip() == "<<STOPPED>>", stopped[-2000:]
