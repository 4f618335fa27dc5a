# Mitogen's linear strategy on the bundle's own plugin path (ansible.cfg's
# strategy_plugins), so that `strategy = mitogen_linear` needs only
# `pip install mitogen` beside Ansible, not the path of its installed plugins.
# Mitogen keeps one Python interpreter per host for the whole run instead of
# starting one per task (a 61-task playbook over docker: 14-24 s, not 36-43).
import ansible_mitogen.strategy
from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule  # noqa: F401

# Plays on the control host keep Ansible's own local connection: async tasks
# started there (Molecule's create and destroy run docker_container so) never
# finish under Mitogen's, and a local task gains nothing from it.
ansible_mitogen.strategy.REDIRECTED_CONNECTION_PLUGINS = tuple(
    name for name in ansible_mitogen.strategy.REDIRECTED_CONNECTION_PLUGINS if name != "local")
