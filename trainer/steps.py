"""The step graphs: the tf.functions of both protocols over the same PS variables.

- ASP (`asp`, `asp_unrolled`): every closure computes a gradient on a worker and applies it
  to the PS directly; each step of a closure has its own batch, gradient and update, exactly
  as if the steps had been scheduled one by one. A full closure of K steps runs the K steps
  unrolled (one traced function per K), not in a `tf.range` loop: a loop over steps that
  read and update PS variables is split into a worker loop and a PS loop kept in step by RPCs
  on every iteration (measured: unrolled ~14 % more steps/s at K = 8 on the digits CNN).
  Each step takes a ticket on the PS (`asp_open` sets the stretch's last): steps past it (a
  closure TensorFlow ran again after a worker loss, or one a hung worker finished late)
  are dropped whole, so budgets are exact.
- BSP one step (`bsp_accumulate`): every worker adds its gradient to the packed
  accumulators on the PS and takes a ticket; the N-th ticket averages them by their count
  and updates the weights in the same call (`bsp_apply` applies from the chief, for the
  rare round whose closures were all stale).
- BSP rounds (`bsp_rounds(K)`, K rounds unrolled, or `bsp_looped(iterator, worker_id,
  group, K)`, one trace for every K; `bsp_open`, `bsp_close`, `bsp_discard`): with one
  worker, its gradient applied as it comes (`_sole_round`). With N: the barrier of each
  global step held on the PS instead of by the chief, in one PS-side call per round
  (`barrier_round`): every worker adds its gradient to the accumulators, then takes a
  ticket (`ResourceCountUpTo` on a PS counter: an atomic fetch-and-increment); the worker
  holding the N-th ticket applies the mean of the N gradients, resets the accumulators,
  increments the global step and then wakes the round's workers: one token `[step, group]`
  into each admission slot's FIFO queue on the PS (`wake`); every worker, the applier too,
  then waits for its slot's token (`wait_wake`: a blocking dequeue, an asynchronous kernel
  that holds none of the PS's threads and sends nothing while it waits) and starts the next
  round on the new weights. So every global step is still exactly one update from one
  gradient of every worker, and the group stops exactly at the step the chief opened it for
  (`bsp_stop`). A late `bsp_joined` ticket keeps a rerun of a lost worker's closure out of a
  group still open; the chief's `bsp_close` wakes every slot (the waiters find the group
  closed and apply nothing more), and `bsp_open` drains what tokens a closed group left.

The weights come in and the gradients go out as one tensor per PS (trainer/packing.py).

Every worker closure returns the float64 vector `[loss, worker_id, step_time_s, steps]`:
`loss` of its last step, `worker_id` the index of the worker that ran it (a per-worker
resource, `per_worker_ids`), `step_time_s` the mean time of its `steps` steps, each measured
with `tf.timestamp()` on the worker from before the batch is read to when the loss (so the
gradient) is computed; the update RPCs to the PS that follow are not included. It includes
an injected straggler delay (`spec.stragglers`), which sleeps inside the step on the worker
(trainer/tfcompat.py `sleep`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer import tfcompat
from trainer.optim import tf_var
from trainer.spec import StragglerSpec
from trainer.variables import BSP_CLOSED, PSVariables, straggler_delay, tf_range

WAKE_CAPACITY = 2 ** 30  # a BSP wake queue's bound; never reached (drained by each group)
TICKET_LIMIT = 2 ** 62  # ResourceCountUpTo needs a limit; never reached


class Steps:
    """The tf.functions of both protocols (module docstring), built over `v`.

    Workers (scheduled by the chief, args `(iterator, worker_id, ...)`, a result vector
    back): `asp(iterator, worker_id, steps)`, `asp_unrolled(K)(iterator, worker_id)`,
    `bsp_accumulate(iterator, worker_id)`, `bsp_rounds(K)(iterator, worker_id, group)`,
    `bsp_looped(iterator, worker_id, group, K)`.
    Chief, ops on the PS: `asp_open(stop)`, `bsp_apply()`, `bsp_open(group, steps)` -> the
    global step at the group's start, `bsp_close()`, `bsp_discard()` -> global step.
    `workers`: the gradients per BSP round."""

    def __init__(self, strategy: Any, model: Any, optimizer: Any, job: Any, v: PSVariables,
                 stragglers: list[StragglerSpec], workers: int) -> None:
        import tensorflow as tf

        from trainer.packing import Packing

        self.strategy, self.model, self.optimizer, self.job, self.v = (
            strategy, model, optimizer, job, v)
        self.stragglers, self.workers = stragglers, workers
        # the weights come in and the gradients go out as one tensor per PS; the model runs
        # on those values (Keras' stateless call), and its new statistics (batch norm's
        # moving averages) are written back as its own call would have written them
        self.weights = Packing(optimizer.variables)  # model.trainable_variables, in order
        self.statistics = Packing([tf_var(s) for s in model.non_trainable_variables])
        self.decayed = [len(w.shape) > 1 for w in self.weights.variables]  # skips biases, BN
        with tf.device(v.global_step.device):  # one applier at a time: check, then apply
            self.exclusive = tf.CriticalSection(name="bsp_apply")
            # a BSP group's barrier: one queue of wake tokens per admission slot (module
            # docstring); not checkpointed, drained by every `bsp_open`
            self.wakes = [tf.queue.FIFOQueue(WAKE_CAPACITY, [tf.int64], shapes=[[2]],
                                             name=f"bsp_wake_{slot}")
                          for slot in range(workers)]
        self.quorum = tf.constant(workers, tf.int64)
        self.flats: list[Any] = []  # the packed gradients of the BSP round being built
        self.adds: list[Any] = []  # the accumulate ops of the one-step closure being built
        self.unrolled: dict[int, Callable] = {}  # K -> ASP closure of K steps
        self.rounds: dict[int, Callable] = {}  # K -> BSP group closure of K rounds

        self.asp = tf.function(self._asp_looped)
        self.asp_open = tf.function(self._asp_open)
        self.bsp_accumulate = tf.function(self._bsp_accumulate)
        self.bsp_apply = tf.function(self._bsp_apply)
        self.bsp_open = tf.function(self._bsp_open)
        self.bsp_close = tf.function(self._bsp_close)
        self.bsp_discard = tf.function(self._bsp_discard)
        self.bsp_looped = tf.function(self._bsp_looped)
        self.barrier_round = tf.function(self._barrier_round,
                                         experimental_attributes={"_noinline": True})

    # --- one step on a worker ---------------------------------------------------------------

    def loss_and_grads(self, batch: Any, packed: bool = False) -> tuple[Any, list[Any]]:
        """The loss, and the gradients placed on their variables' parameter servers: one
        tensor per variable, or (`packed`) one flat tensor per PS, as BSP accumulates them."""
        import tensorflow as tf

        images, labels = batch
        values, stats = self.weights.read(), self.statistics.read()
        with tf.GradientTape() as tape:
            tape.watch(values)
            logits, new_stats = self.model.stateless_call(values, stats, images, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits))
            if self.job.weight_decay:
                loss += self.job.weight_decay * tf.add_n(
                    [tf.nn.l2_loss(w) for w, d in zip(values, self.decayed, strict=True) if d])
        grads = tape.gradient(loss, values)
        for var, value in zip(self.statistics.variables,
                              self.statistics.to_variables(new_stats), strict=True):
            var.assign(value, read_value=False)
        if packed:
            return loss, self.weights.pack(grads)
        return loss, self.weights.to_variables(grads)

    def current_lr(self) -> Any:
        """The learning rate, computed where the step counter lives: the updates on the PS
        use it, and a worker would otherwise fetch two scalars and send the rate back on
        every step."""
        import tensorflow as tf

        from trainer.optim import lr_tensor

        with tf.device(self.v.global_step.device):
            return lr_tensor(self.v.global_step, self.job, self.optimizer.learning_rate)

    def timed(self, iterator: Any, worker_id: Any, body: Callable) -> tuple[Any, Any]:
        """Run `body` on the next batch (after any straggler delay); (loss, seconds)."""
        import tensorflow as tf

        v = self.v
        started = tf.timestamp()
        deps = []
        with tf.control_dependencies([started]):
            if self.stragglers:
                delay = straggler_delay(self.stragglers, worker_id,
                                        started - v.train_epoch.read_value(),
                                        v.global_step.read_value())
                deps = [tf.cond(delay > 0, lambda: tfcompat.sleep(delay),
                                lambda: tf.constant(0, tf.int64))]
        with tf.control_dependencies(deps):
            batch = next(iterator)
        loss = self.strategy.run(body, args=(batch,))
        with tf.control_dependencies([loss]):
            ended = tf.timestamp()
        return tf.cast(loss, tf.float64), ended - started

    @staticmethod
    def result(loss: Any, worker_id: Any, seconds: Any, steps: Any) -> Any:
        """One float64 vector, not four tensors: the coordinator copies every closure
        output to the chief, one RPC per tensor."""
        import tensorflow as tf

        return tf.stack([loss, tf.cast(worker_id, tf.float64), seconds,
                         tf.cast(steps, tf.float64)])

    @staticmethod
    def ticket(var: Any) -> Any:
        """Atomic fetch-and-increment of an int64 PS variable: the value before."""
        import tensorflow as tf

        return tf.raw_ops.ResourceCountUpTo(resource=var.handle, limit=TICKET_LIMIT,
                                            T=tf.int64)

    # --- ASP ------------------------------------------------------------------------------
    # The updates are not chained to the returned loss: forcing that order serialises the
    # PS round trips and cost ~15 % of ASP throughput. The function still ends only after
    # every update (automatic control dependencies); step_time_s ends at the loss.

    def _asp_body(self, batch: Any) -> Any:
        import tensorflow as tf

        v = self.v
        loss, grads = self.loss_and_grads(batch)
        # the step's ticket, taken on the PS once its gradient is there: below the stretch's
        # stop, the update is applied and counted; past it, the step is dropped
        with tf.device(v.global_step.device), tf.control_dependencies(grads):
            take = self.ticket(v.asp_tickets) < v.asp_stop.read_value()
        self.optimizer.apply(grads, self.current_lr(), take)
        with tf.device(v.global_step.device):
            v.global_step.assign_add(tf.cast(take, tf.int64))
        return loss

    def _asp_steps(self, iterator: Any, worker_id: Any, loop: Any, steps: Any) -> Any:
        """`steps` ASP steps, one per item of `loop`: a `tf.range` (a graph loop) or a Python
        `range` (unrolled at trace time)."""
        import tensorflow as tf

        loss, total = tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64)
        for _ in loop:
            loss, seconds = self.timed(iterator, worker_id, self._asp_body)
            total += seconds
        return self.result(loss, worker_id,
                           total / tf.cast(tf.maximum(steps, 1), tf.float64), steps)

    def _asp_looped(self, iterator: Any, worker_id: Any, steps: Any) -> Any:
        import tensorflow as tf

        # `steps` is an int64 tensor: one trace serves every closure length
        return self._asp_steps(iterator, worker_id, tf.range(steps), steps)

    def asp_unrolled(self, k: int) -> Callable:
        """The ASP closure of exactly `k` steps, unrolled in Python (one traced function per
        K): the same steps as `asp`'s loop without its cost (A/B on the digits CNN at K = 8:
        50 steps/s looped, 57 unrolled; docs/benchmarks.md has the dispatch figures). Each
        step still reads the weights the previous one updated: ops on the same variable run
        in program order."""
        import tensorflow as tf

        if k not in self.unrolled:
            def asp_k(iterator: Any, worker_id: Any) -> Any:
                return self._asp_steps(iterator, worker_id, range(k), k)

            self.unrolled[k] = tf.function(asp_k)
        return self.unrolled[k]

    def _asp_open(self, stop: Any) -> None:
        """ASP steps from now on are applied until the global step reaches `stop`: the
        tickets left are set to the steps left. The tickets are read before the step, so a
        step landing between the two reads (a hung worker's, late) leaves the stretch one
        step short, never one over: the chief then runs that step in its next stretch."""
        import tensorflow as tf

        v = self.v
        with tf.device(v.global_step.device):
            taken = v.asp_tickets.read_value()
            with tf.control_dependencies([taken]):
                step = v.global_step.read_value()
            v.asp_stop.assign(taken + stop - step, read_value=False)

    # --- BSP, one step per closure ---------------------------------------------------------

    def _accumulate_body(self, batch: Any) -> Any:
        import tensorflow as tf

        v = self.v
        loss, flats = self.loss_and_grads(batch, packed=True)
        self.adds = []
        for acc, flat in zip(v.accumulators, flats, strict=True):
            with tf.device(acc.device):
                self.adds.append(acc.assign_add(flat, read_value=False))
        with tf.device(v.global_step.device):
            self.adds.append(v.grad_count.assign_add(tf.constant(1.0), read_value=False))
        return loss

    def _bsp_accumulate(self, iterator: Any, worker_id: Any) -> Any:
        """One worker's gradient of the global step the closure starts in, added to the
        accumulators; the N-th of the step (by its ticket) applies, in the same PS-side call
        (`apply_accumulated`, which a stale closure's apply, whose step moved meanwhile,
        leaves alone). The chief's barrier then only waits for the N closures."""
        import tensorflow as tf

        v = self.v
        with tf.device(v.global_step.device):
            expected = v.global_step.read_value()
        with tf.control_dependencies([expected]):
            loss, seconds = self.timed(iterator, worker_id, self._accumulate_body)
        with tf.device(v.global_step.device):
            with tf.control_dependencies(self.adds):
                mine = self.ticket(v.bsp_tickets)
            tf.cond(mine + 1 >= self.quorum, lambda: self.apply_accumulated(expected),
                    lambda: expected)
        return self.result(loss, worker_id, seconds, 1)

    def _bsp_apply(self) -> None:
        import tensorflow as tf

        # on the chief: what is accumulated, applied now (the one-step closures apply their
        # own step; this one is for a step whose closures were all stale, and the tests)
        with tf.device(self.v.global_step.device):
            self.apply_accumulated(self.v.global_step.read_value())

    def apply_accumulated(self, expected: Any, group: Any = None) -> Any:
        """One update from the mean of the accumulated gradients, then the accumulators and
        tickets reset and the counters moved, the global step last, if the global step is
        still `expected` (and the BSP group `group` still open; then the round's waiters
        are woken once the step moved: one token per slot, `wake`); returns the global
        step after.

        Exactly one update per global step, whoever dies when: every op runs on a PS, its
        inputs read there, so once the PS holds the request it completes the update, the
        resets and the step together even if the worker that sent it is killed meanwhile.
        (An op left on the worker, as `tf.zeros_like` and a cast were, made the PS wait for
        it: a worker killed in the apply left the update applied and the step unmoved, one
        update too many.) The check of the step and the group and the apply hold a mutex on
        the PS (`tf.CriticalSection`), so of two appliers of one round (a closure of a closed
        group, hung or rerun, that took a ticket in a later round) one applies, and a stale
        one never does."""
        import tensorflow as tf

        v = self.v

        def apply() -> Any:
            count = v.grad_count.read_value()
            means = []
            for acc in v.accumulators:
                with tf.device(acc.device):
                    means.append(acc.read_value() / count)
            updates = self.optimizer.apply(self.weights.unpack(means), self.current_lr())
            with tf.control_dependencies(updates):
                resets = []
                for acc in v.accumulators:
                    with tf.device(acc.device):
                        resets.append(acc.assign(tf.zeros(acc.shape, acc.dtype),
                                                 read_value=False))
                resets += [v.grad_count.assign(0.0, read_value=False),
                           v.bsp_tickets.assign(0, read_value=False),
                           v.bsp_gradients.assign_add(tf.cast(count, tf.int64),
                                                      read_value=False),
                           v.bsp_updates.assign_add(1, read_value=False)]
            with tf.control_dependencies(resets):
                after = v.global_step.assign_add(1)
            if group is None:
                return after
            with tf.control_dependencies([self.wake(after, group)]):
                return tf.identity(after)

        def check_and_apply() -> Any:
            current = v.global_step.read_value()
            go = tf.equal(current, expected)
            if group is not None:
                go = tf.logical_and(go, tf.equal(v.bsp_group.read_value(), group))
            return tf.cond(go, apply, lambda: current)

        with tf.device(v.global_step.device):
            return self.exclusive.execute(check_and_apply, exclusive_resource_access=False)

    # --- BSP rounds: the barrier held on the PS ------------------------------------------

    def bsp_rounds(self, k: int) -> Callable:
        """The group closure of `k` rounds, unrolled in Python as ASP's closures are (one
        traced function per K): worker (iterator, worker_id, group) -> result vector."""
        import tensorflow as tf

        if k not in self.rounds:
            def rounds_k(iterator: Any, worker_id: Any, group: Any) -> Any:
                return self._bsp_rounds(iterator, worker_id, group, k)

            self.rounds[k] = tf.function(rounds_k)
        return self.rounds[k]

    def _bsp_looped(self, iterator: Any, worker_id: Any, group: Any, k: Any) -> Any:
        # `k` is an int64 tensor: one trace, made before training, serves every K
        return self._bsp_rounds(iterator, worker_id, group, k, tf_range(k))

    def _bsp_rounds(self, iterator: Any, worker_id: Any, group: Any, k: Any,
                    loop: Any = None) -> Any:
        """`k` rounds of the open group `group`, one per item of `loop` (a `tf.range`, a
        graph loop) or unrolled (`loop` None: a Python range). What crosses per round: the
        weights in (one tensor per PS) and the gradients out (one per PS), as for an ASP
        step; the barrier (`ps_round`) is wholly on the PS, and the next round's clock on the
        worker is ordered after it (a control edge)."""
        import tensorflow as tf

        v, zero = self.v, tf.constant(0.0, tf.float64)
        with tf.device(v.global_step.device):
            group_on_ps = tf.identity(group)  # crosses once, not once per round
            if self.workers == 1:
                # every closure of the sole worker's group is admitted: they run one after
                # another on it, each round applied only at the step it expects and below
                # the group's stop, so a rerun (after the worker's loss) or a closure the
                # group no longer needs applies nothing past the stop (no ticket to take)
                joined, admitted = tf.constant(0, tf.int64), tf.constant(True)
                step = v.global_step.read_value()
            else:
                joined = self.ticket(v.bsp_joined)  # a rerun of a lost worker's comes late
                with tf.control_dependencies([joined]):
                    step = v.global_step.read_value()
                admitted = joined < self.quorum
            rounds = tf.constant(0, tf.int64)  # counted where the step is
        loss, total = zero, zero
        # Each round's clock starts after the previous round's barrier. Not the sole worker's
        # unrolled rounds: their reads of the weights wait for the previous update anyway
        # (ops on one variable run in program order), as ASP's steps do, and waiting for the
        # step too put a PS-to-worker crossing before the next batch is read.
        ordered = self.workers > 1 or loop is not None
        for _ in range(k) if loop is None else loop:
            with tf.control_dependencies([step] if ordered else []):
                loss, seconds = self.timed(iterator, worker_id, self._rounds_body)
            total += seconds
            ended = self.ps_round(self.flats, step, group_on_ps, admitted, joined)
            with tf.device(v.global_step.device):
                rounds += tf.cast(ended > step, tf.int64)
            step = ended
        return self.result(loss, worker_id,
                           total / tf.cast(tf.maximum(rounds, 1), tf.float64), rounds)

    def _rounds_body(self, batch: Any) -> Any:
        loss, self.flats = self.loss_and_grads(batch, packed=True)
        return loss

    def ps_round(self, flats: list[Any], step: Any, group: Any, admitted: Any,
                 slot: Any) -> Any:
        """The PS's part of a round, in one call: if the closure is admitted, the group
        `group` open, the global step still `step` and below the group's stop, add the
        gradients to the accumulators (masked: one add per PS either way), take a ticket,
        from the N-th ticket on, apply (`apply_accumulated`, which lets one applier of the
        round through and wakes the round's workers), and wait for the wake token of this
        closure's admission `slot`; one worker applies at once (`_sole_round`). Returns the
        global step after the round (`step` if the closure took no part in it)."""
        import tensorflow as tf

        v = self.v
        # checked once the gradients are on the PS: a worker that hangs before sending them
        # must not find the round open by a check made before it hung
        with tf.device(v.global_step.device), tf.control_dependencies(flats):
            go = tf.logical_and(admitted, tf.equal(v.bsp_group.read_value(), group))
            go = tf.logical_and(go, tf.logical_and(
                tf.equal(v.global_step.read_value(), step), step < v.bsp_stop.read_value()))
        if self.workers == 1:
            return self._sole_round(flats, go)
        with tf.device(v.global_step.device):
            return self.barrier_round(flats, step, group, go, slot)

    def _barrier_round(self, flats: list[Any], step: Any, group: Any, go: Any,
                       slot: Any) -> Any:
        """`ps_round`'s part with several workers, a function of its own on the PS
        (`barrier_round`, not inlined): its conditionals (the apply, the wait) are traced and
        instantiated once, not once per round of every K (measured in process, K = 14: the
        first call of a group closure took 8 s with them inlined, 0.8 s for one worker's)."""
        import tensorflow as tf

        v = self.v
        adds = []
        for acc, flat in zip(v.accumulators, flats, strict=True):
            with tf.device(acc.device):
                adds.append(acc.assign_add(tf.where(go, flat, tf.zeros_like(flat)),
                                           read_value=False))
        with tf.device(v.global_step.device):
            adds.append(v.grad_count.assign_add(tf.cast(go, tf.float32), read_value=False))

            def contribute() -> Any:
                mine = self.ticket(v.bsp_tickets)
                # from the N-th ticket on, every gradient of the round is in; a stale
                # closure's ticket may come first, so every such holder tries
                applied = tf.cond(mine + 1 >= self.quorum,
                                  lambda: self.apply_accumulated(step, group), lambda: step)
                with tf.control_dependencies([applied]):
                    return self.wait_wake(slot)[0]

            with tf.control_dependencies(adds):
                return tf.cond(go, contribute, lambda: step)

    def _sole_round(self, flats: list[Any], go: Any) -> Any:
        """`ps_round` of the only worker: its gradient is the round's mean, so it is applied
        as it comes, masked by `go` as ASP's steps are by their ticket (no accumulator, no
        ticket, no lock, no wait: no other applier can be admitted to the open group); one
        update and one step, or, not `go`, nothing."""
        import tensorflow as tf

        v = self.v
        updates = self.optimizer.apply(self.weights.unpack(flats), self.current_lr(), go)
        with tf.device(v.global_step.device):
            counted = tf.cast(go, tf.int64)
            with tf.control_dependencies(updates):
                counters = [v.bsp_gradients.assign_add(counted, read_value=False),
                            v.bsp_updates.assign_add(counted, read_value=False)]
            with tf.control_dependencies(counters):
                # read now: `assign_add`'s value is a lazy read, which a later round's
                # comparison would take after that round's own add
                return tf.identity(v.global_step.assign_add(counted))

    def wake(self, step: Any, group: Any) -> Any:
        """One token `[step, group]` for every admission slot's queue (on the PS): the
        round's applier wakes its N workers (itself included: each waits once per round),
        the chief's close wakes whoever waits for a round that will not be applied."""
        import tensorflow as tf

        token = tf.stack([tf.cast(step, tf.int64), tf.cast(group, tf.int64)])
        return tf.group([queue.enqueue(token) for queue in self.wakes])

    def wait_wake(self, slot: Any) -> Any:
        """Block on the PS until this slot's next wake token comes; returns it. A queue's
        dequeue is an asynchronous kernel: the wait holds none of the PS's threads, and no
        RPC goes to or from the waiting worker meanwhile (the call stays open: the keepalive
        of trainer/keepalive.py lets a call be silent for minutes). Each slot has its own
        queue, so a worker quick into the next round cannot take a token meant for a worker
        still waiting for the previous one."""
        import tensorflow as tf

        return tf.switch_case(tf.cast(slot, tf.int32),
                              [lambda queue=queue: queue.dequeue() for queue in self.wakes])

    def _bsp_open(self, group: Any, steps: Any) -> Any:
        import tensorflow as tf

        v = self.v
        # the tokens a closed group left (its close's, a round's nobody waited for): called
        # only when every closure of the last group ended (or is a hung worker's, which the
        # close woke), so nothing waits on the queues now
        drained = [queue.dequeue_many(queue.size()) for queue in self.wakes]
        with tf.control_dependencies(drained):
            start = v.global_step.read_value()
        resets = [v.bsp_joined.assign(0, read_value=False),
                  v.bsp_tickets.assign(0, read_value=False),
                  v.bsp_stop.assign(start + steps, read_value=False)]
        with tf.control_dependencies(resets):
            v.bsp_group.assign(group, read_value=False)
        return start

    def _bsp_close(self) -> None:
        import tensorflow as tf

        v = self.v
        closed = v.bsp_group.assign(BSP_CLOSED, read_value=True)
        with tf.control_dependencies([closed]):  # woken, a waiter finds the group closed
            self.wake(v.global_step.read_value(), closed)

    def _bsp_discard(self) -> Any:
        import tensorflow as tf

        v = self.v
        # called only when every closure of the group has ended: nothing races the resets
        resets = []
        for acc in v.accumulators:
            with tf.device(acc.device):
                resets.append(acc.assign(tf.zeros(acc.shape, acc.dtype), read_value=False))
        resets += [v.grad_count.assign(0.0, read_value=False),
                   v.bsp_tickets.assign(0, read_value=False)]
        with tf.control_dependencies(resets):
            return v.global_step.read_value()
