"""The learning-rate schedule and the optimizer: values, serialization, the fused update."""

import keras
import numpy as np
import pytest

from chatbot.training.optimizer import FusedAdam, WarmupSchedule, transformer_optimizer


def test_schedule_values_at_known_steps():
    schedule = WarmupSchedule(d_model=128, warmup_steps=4000)
    # lr(step) = 128^-0.5 * min(step^-0.5, step * 4000^-1.5), with the optimizer's step 0 as step 1
    for step in (1, 1000, 4000, 10000):
        expected = 128 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
        assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)
    assert float(schedule(3999)) > float(schedule(999)) and float(schedule(3999)) > float(schedule(19999))


def test_optimizer_and_schedule_serialize():
    optimizer = transformer_optimizer(128, 4000)
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(clone) is type(optimizer)
    assert clone.beta_2 == 0.98 and clone.epsilon == 1e-9
    assert float(clone.learning_rate) == pytest.approx(float(WarmupSchedule(128, 4000)(0)))  # at iteration 0


def test_a_peak_learning_rate_keeps_the_schedule_shape_but_sets_its_top():
    schedule = WarmupSchedule(d_model=128, warmup_steps=1000, peak_learning_rate=1e-3)
    rates = [float(schedule(step - 1)) for step in (1, 500, 1000, 4000)]  # the optimizer counts from 0
    assert rates[0] == pytest.approx(1e-6) and rates[1] == pytest.approx(5e-4)
    assert rates[2] == pytest.approx(1e-3) and rates[3] == pytest.approx(5e-4)  # 1/sqrt(step) after the peak
    assert WarmupSchedule.from_config(schedule.get_config()).peak_learning_rate == 1e-3


def test_fused_adam_updates_as_keras_adam_and_sums_repeated_rows_of_a_sparse_gradient():
    """Dense gradients: the same weights as Keras' Adam after a few scheduled steps. An embedding's sparse
    gradient with a row repeated (a token twice in a batch): the update of its summed, dense gradient
    (Keras 3's own Adam squares each repeat apart, so that row gets another second moment)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    gradients = [tf.constant(rng.normal(size=(3, 4)), "float32") for _ in range(4)]
    sparse = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]]), tf.constant([0, 0, 2]),
                              tf.constant([4, 2]))

    def trained(optimizer, steps):
        variable = keras.Variable(np.ones(steps[0].shape, "float32"))
        for gradient in steps:
            optimizer.apply_gradients([(gradient, variable)])
        return variable.numpy()

    def adam(kind):
        return kind(WarmupSchedule(8, warmup_steps=2), beta_1=0.9, beta_2=0.98, epsilon=1e-9)

    fused = trained(adam(FusedAdam), gradients)
    assert not np.allclose(fused, 1.0)
    np.testing.assert_allclose(fused, trained(adam(keras.optimizers.Adam), gradients), rtol=1e-5)
    dense = [tf.convert_to_tensor(sparse)] * 3
    np.testing.assert_allclose(trained(adam(FusedAdam), [sparse] * 3), trained(adam(keras.optimizers.Adam), dense),
                               rtol=1e-5)
    assert isinstance(transformer_optimizer(128), FusedAdam)


def test_optimizer_configs_load_by_registered_name_whatever_module_they_name():
    """Keras finds the classes by their registered names ("chatbot>FusedAdam"), so a saved config that names
    another module (where they were defined before) still loads."""
    import json

    saved = json.loads(json.dumps(keras.optimizers.serialize(transformer_optimizer(128, 4000))))
    assert saved["registered_name"] == "chatbot>FusedAdam"
    assert saved["config"]["learning_rate"]["registered_name"] == "chatbot>WarmupSchedule"
    saved["module"] = saved["config"]["learning_rate"]["module"] = "chatbot.training.losses"
    clone = keras.optimizers.deserialize(saved)
    assert type(clone) is FusedAdam and clone.beta_2 == 0.98
    assert float(clone.learning_rate) == pytest.approx(float(WarmupSchedule(128, 4000)(0)))
