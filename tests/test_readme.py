"""README.rst's first screen: the commands that set up and run the project."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest'


def read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def test_test_command_says_how_long_it_takes():
    readme = read('README.rst')
    assert TEST_COMMAND in read('.ci', 'run')      # CI runs what it shows
    first_screen = readme[:readme.index(TEST_COMMAND)]
    intro = first_screen.rstrip().rsplit('\n\n', 1)[-1]
    assert intro.startswith('Run the tests'), intro
    assert re.search(r'about [\d.]+ minutes on \d+ cores', intro), intro
