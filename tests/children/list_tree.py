"""``list_tree(ROOT)`` in a process of its own; prints the error it raised as ``Type message``.

Its own process so that the test can drop root's power to read any folder in it.
"""
import sys

from beam_prep.write.plan.listing import list_tree

if __name__ == "__main__":
    try:
        list_tree(sys.argv[1])
    except Exception as e:
        print(type(e).__name__, e)
