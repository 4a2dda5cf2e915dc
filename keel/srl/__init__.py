"""The pure domain of the SRL family (Supervised Reinforcement Learning, arXiv 2510.25992).

Nothing here does I/O: activities read files, call models and run ast-grep, then hand the
bytes and texts to these functions. See docs/srl.md.
"""
