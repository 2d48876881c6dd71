"""`python -m infra.config --table`: docs/configuration.md's table of stack keys."""

import sys

from infra.config.table import readme_table

if sys.argv[1:] != ["--table"]:
    sys.exit("usage: python -m infra.config --table   (docs/configuration.md's table)")
print(readme_table())
