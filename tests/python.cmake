# Python-driven tests (included from tests/CMakeLists.txt). The library never depends on
# Python; these tests only drive the `moe` executable and compare with a float64 numpy
# reference. They need numpy and safetensors at test time (CI: pip install numpy safetensors).
#
# conformance_f64: tests/conformance/run_conformance.py, labelled fast. When numpy or
# safetensors is not importable at configure time the test is still registered, so it fails
# loudly at test time instead of being skipped.
find_package(Python3 COMPONENTS Interpreter)

set(MOE_CONFORMANCE_SCRIPT ${CMAKE_CURRENT_SOURCE_DIR}/conformance/run_conformance.py)

if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import numpy, safetensors"
    RESULT_VARIABLE MOE_PY_DEPS_RC
    OUTPUT_QUIET ERROR_QUIET)
  if(NOT MOE_PY_DEPS_RC EQUAL 0)
    message(WARNING "${Python3_EXECUTABLE} cannot import numpy and safetensors: the "
                    "conformance_f64 test will fail until they are installed "
                    "(pip install numpy safetensors), or configure with "
                    "-DPython3_EXECUTABLE=<a python that has them>.")
  endif()
  add_test(NAME conformance_f64
           COMMAND ${Python3_EXECUTABLE} ${MOE_CONFORMANCE_SCRIPT}
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
else()
  message(WARNING "No Python 3 interpreter found: the conformance_f64 test will fail. "
                  "Install python3 with numpy and safetensors.")
  # Registered anyway, as a test that fails with the reason, never a silent skip.
  add_test(NAME conformance_f64
           COMMAND ${CMAKE_COMMAND} -E echo
                   "conformance_f64: no Python 3 interpreter was found at configure time")
  set_tests_properties(conformance_f64 PROPERTIES
                       FAIL_REGULAR_EXPRESSION "no Python 3 interpreter")
endif()

set_tests_properties(conformance_f64 PROPERTIES
  LABELS fast
  ENVIRONMENT "LIBMOE_BIN=$<TARGET_FILE:moe>;PYTHONDONTWRITEBYTECODE=1"
  TIMEOUT 900)

# readme_recipe: tests/readme_recipe.py, README "Against transformers" as written on the
# fixtures and docs/families.md's block table against them (numpy + safetensors, as above).
if(Python3_Interpreter_FOUND)
  add_test(NAME readme_recipe
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/readme_recipe.py
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(readme_recipe PROPERTIES
    LABELS fast
    ENVIRONMENT "LIBMOE_BIN=$<TARGET_FILE:moe>;LIBMOE_SOURCE_DIR=${CMAKE_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1"
    TIMEOUT 300)
endif()
