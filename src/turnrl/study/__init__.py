"""Studies: declared matrices of training runs, run resumably and summarised with
honest statistics into tables, figures and the docs (``turnrl study``).

- :mod:`~turnrl.study.declaration`: what a study is (arms x seeds x warm starts x
  settings) and the cells it expands to;
- :mod:`~turnrl.study.catalogue`: every study of this repository;
- :mod:`~turnrl.study.runner`: runs the missing cells, ``--jobs`` at a time;
- :mod:`~turnrl.study.statistics`: mean, ddof=1 sd, paired t-interval, sign-flip
  test, verdict, power;
- :mod:`~turnrl.study.tables`, :mod:`~turnrl.study.figures`,
  :mod:`~turnrl.study.provenance`, :mod:`~turnrl.study.markers`,
  :mod:`~turnrl.study.summary`: the outputs;
- :mod:`~turnrl.study.power`: what a design can detect, from a pilot;
- :mod:`~turnrl.study.cli`: ``turnrl study list | run | summarise | power``.
"""
