# The wheel that `pip install .` builds (pyproject.toml; included when scikit-build-core configures):
#
#   site-packages/lifeline/            the modules, the _lifeline extension, liblifeline.so.0
#   site-packages/lifeline/_bin/       lifeline, lifeline-agent, lifeline-sim (and sim_plot.py), run
#                                      by the venv's commands of the same names (lifeline/_launch.py)
#   site-packages/lifeline_startup/    the ranks' start-up hook, which the agent finds from its own place
#
# All of it is component "wheel", the only one pyproject.toml installs: the system install's rules
# (headers, CMake package, PREFIX/lib/python3/dist-packages) stay out of the wheel.
set(wheel_pkg ${SKBUILD_PLATLIB_DIR}/lifeline)

# The extension finds liblifeline beside it. The programs link the library statically; $ORIGIN/..
# is where the wheel's copy lies should one of them link it.
set_target_properties(lifeline_python PROPERTIES INSTALL_RPATH "$ORIGIN")
set_target_properties(lifeline_cli lifeline_agent lifeline_sim PROPERTIES INSTALL_RPATH "$ORIGIN/..")

install(TARGETS lifeline_python LIBRARY DESTINATION ${wheel_pkg} COMPONENT wheel)
install(TARGETS lifeline_cli lifeline_agent lifeline_sim RUNTIME DESTINATION ${wheel_pkg}/_bin COMPONENT wheel)
# The library under its SONAME alone: a wheel holds no symlinks, and would store it once per name.
get_target_property(wheel_soversion lifeline SOVERSION)
set_target_properties(lifeline PROPERTIES VERSION ${wheel_soversion})
install(TARGETS lifeline LIBRARY DESTINATION ${wheel_pkg} NAMELINK_SKIP COMPONENT wheel)

file(GLOB wheel_py_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/lib/python/lifeline/*.py)
install(FILES ${wheel_py_sources} DESTINATION ${wheel_pkg} COMPONENT wheel)
file(GLOB wheel_py_startup CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/lib/python/lifeline_startup/*.py)
install(FILES ${wheel_py_startup} DESTINATION ${SKBUILD_PLATLIB_DIR}/lifeline_startup COMPONENT wheel)
# `lifeline-sim --plot` runs it (LIFELINE_SIM_PLOT, set by _launch.py): the source tree is not there.
install(FILES tools/sim_plot.py DESTINATION ${wheel_pkg}/_bin COMPONENT wheel)
