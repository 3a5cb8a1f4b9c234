"""`DeviceMethods`: the methods one device runs, and what the runtime asks of all.

Built over the device's `DeviceContext` from its ``[[methods]]`` table and
its trainer (`ursa.edge_sdk.methods.registry.compose_methods`), with the
methods the app's factories build, federated evaluation, and the secure
means serving them. The runtime asks them together: the registration key,
a transfer that is not a model's, the data a balancing method leaves, an
error the coordinator sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.fleet_eval import FleetEvaluator
from ursa.edge_sdk.local_dataset import LocalDataset
from ursa.edge_sdk.method import DeviceContext, DeviceMethod, MethodFactory
from ursa.edge_sdk.methods.registry import compose_methods
from ursa.edge_sdk.methods_config import selection_kind
from ursa.edge_sdk.secure_mean import with_secure_means
from ursa.protocol.messages import ErrorReply
from ursa.protocol.methods import MethodRole
from ursa.protocol.router import Router

__all__ = ["DeviceMethods", "MethodT"]

MethodT = TypeVar("MethodT", bound=DeviceMethod)


class DeviceMethods:
    """The device's methods, in the order their hooks run.

    Raises:
        ValueError: the config's ``[[methods]]`` names other kinds than the
            trainer runs.
    """

    def __init__(
        self,
        config: DeviceConfig,
        data: LocalDataset,
        ctx: DeviceContext,
        given: Sequence[MethodFactory],
    ) -> None:
        self._device_id = config.device_id
        self._selection = selection_kind(config.method_list())
        self._data = data
        specs = config.method_list()
        composed = compose_methods(ctx, specs, data.labels, given)
        evaluation = FleetEvaluator(ctx, config.eval_min_parties)
        self._methods = with_secure_means(ctx, [*composed, evaluation])
        if config.methods is not None:
            named = {m.kind for m in config.methods}
            if named != set(self.names()):
                raise ValueError(
                    f"[[methods]] names {', '.join(sorted(named))}; the trainer "
                    f"runs {', '.join(self.names())}"
                )

    def __iter__(self) -> Iterator[DeviceMethod]:
        return iter(self._methods)

    def of(self, kind: type[MethodT]) -> MethodT:
        """The method of class ``kind``.

        Raises:
            KeyError: the device does not run it.
        """
        for method in self._methods:
            if isinstance(method, kind):
                return method
        raise KeyError(f"{self._device_id} runs no {kind.__name__}")

    def names(self) -> tuple[str, ...]:
        """Selection, training (when the trainer trains models), balancing."""
        roles = [(m.role, m.name) for m in self._methods]
        balancing = tuple(name for role, name in roles if role is MethodRole.BALANCING)
        if self._data.model_trainer is None:
            return (self._selection, *balancing)
        training = [name for role, name in roles if role is MethodRole.TRAINING]
        return (self._selection, *(training or ["fedavg"])[:1], *balancing)

    def register(self, router: Router) -> None:
        """Every method registers its message kinds on ``router``."""
        for method in self._methods:
            method.register(router)

    def start(self) -> None:
        """Every method reloads its persisted progress."""
        for method in self._methods:
            method.start()

    def new_run(self) -> None:
        """Every method forgets the old run's progress."""
        for method in self._methods:
            method.new_run()

    def registration_key(self, epoch: int) -> bytes | None:
        """The first method's key for this epoch's registration (None: none)."""
        for method in self._methods:
            key = method.registration_key(epoch)
            if key is not None:
                return key
        return None

    def settle_data(self) -> None:
        """The first signed key epoch ends any balancing run: the device takes its data.

        Each balancing method is asked once; what it leaves becomes the
        device's labels (and the trainer's samples) before it registers.
        """
        for method in self._methods:
            data = method.replace_data()
            if data is not None:
                self._data.use(method.name, data)

    def on_error_reply(self, message: ErrorReply) -> None:
        """Every method hears what the coordinator refused."""
        for method in self._methods:
            method.on_error_reply(message)
