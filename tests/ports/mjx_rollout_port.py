"""MuJoCo MJX's rollout ported to jaxcontracts: jax.jit(mjx.step) replaced
by jc.hot_step naming the data as the carried state (donated), the loop put in
jc.hot_loop, the reads made explicit."""
import jax.numpy as jnp
import mujoco
from mujoco import mjx

import jaxcontracts as jc

XML = """
<mujoco>
  <option timestep="0.01"/>
  <worldbody>
    <body name="upper" pos="0 0 1">
      <joint name="shoulder" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.05" mass="1"/>
      <body name="lower" pos="0 0 -0.5">
        <joint name="elbow" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.5" size="0.04" mass="0.5"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="shoulder" gear="1"/>
  </actuator>
</mujoco>
"""

mj_model = mujoco.MjModel.from_xml_string(XML)
mjx_model = mjx.put_model(mj_model)
mjx_data = mjx.make_data(mjx_model)
mjx_data = mjx_data.replace(qpos=jnp.array([0.5, -0.3]), ctrl=jnp.array([0.1]))

jit_step = jc.hot_step(mjx.step, state="d")
trajectory = []
with jc.hot_loop(compiles="warmup") as loop:
    for i in loop.iterate(range(100)):
        mjx_data = jit_step(mjx_model, mjx_data)
        if i % 25 == 0:
            trajectory.append([round(float(q), 5) for q in jc.fetch(mjx_data.qpos)])
print(trajectory, round(float(mjx_data.time), 5))
