"""The recipes' learning-rate schedule counted in optimizer updates."""

import keras


@keras.saving.register_keras_serializable(package="keras_reluvit")
class PerUpdate(keras.optimizers.schedules.LearningRateSchedule):
    """`schedule` counted in updates when each update accumulates `steps`
    micro-steps: Keras' optimizer asks its schedule with the micro-step
    count (`gradient_accumulation_steps` leaves the count per micro-step),
    so the u-th update would read the schedule at u * steps."""

    def __init__(self, schedule, steps):
        self.schedule = schedule
        self.steps = int(steps)

    def __call__(self, step):
        return self.schedule(keras.ops.floor_divide(step, self.steps))

    def get_config(self):
        return dict(schedule=keras.saving.serialize_keras_object(self.schedule),
                    steps=self.steps)

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["schedule"]), config["steps"])
