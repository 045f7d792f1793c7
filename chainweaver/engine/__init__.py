"""How a run executes: the two lanes (:mod:`.lanes`) drive a plan's steps through the
step runner (:mod:`.runner`), keep the run's state (:mod:`.run_state`), settle its
outcome (:mod:`.outcome`) and its failures (:mod:`.step_failures`), call tools and
worker threads (:mod:`.calling`), ask for approval (:mod:`.approved`) and keep a
durable run's checkpoints (:mod:`.durable`).

Internal: flow authors use :class:`chainweaver.FlowExecutor` (:mod:`chainweaver.executor`).
"""
