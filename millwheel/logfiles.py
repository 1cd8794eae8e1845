"""Reading JSON-lines log files the way :class:`~millwheel.LogFileSource` reads them.

For tools that check a run against its input (a batch answer, a checker that counts
lost and duplicated records): the same parser, the same file-name times, the same
rules for which files are logs, so a tool and the source never disagree about a line.

>>> rid, ts, value = parse_line(b'{"id": "q1", "ts": 1500, "query": "cats"}', "id", "ts", "part-0.jsonl", 0)
>>> rid, ts, value["query"]
('q1', 1500, 'cats')
>>> parse_line(b"{broken", "id", "ts", "part-0.jsonl", 40)
Traceback (most recent call last):
...
millwheel._logparse.MalformedLine: broken JSON: ...
>>> is_log_file("queries-2026-01-01.jsonl"), is_log_file("_DONE")
(True, False)
"""

from millwheel._logfile import MalformedLine, file_time, is_log_file, parse_line

__all__ = ["MalformedLine", "file_time", "is_log_file", "parse_line"]
