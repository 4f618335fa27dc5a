# Mitogen's linear strategy on the bundle's own plugin path (ansible.cfg's
# strategy_plugins), so that `strategy = mitogen_linear` needs only
# `pip install mitogen` beside Ansible, not the path of its installed plugins.
# Mitogen keeps one Python interpreter per host for the whole run instead of
# starting one per task: the test bed's playbook runs take about half as long.
from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule  # noqa: F401
