# Builds and runs one consumer project against an installed (or vendored) holdfast.
# -DKIND=find_package|add_subdirectory|pkg_config -DSOURCE -DMAIN -DBINARY -DPREFIX -DCXX -DCXX_STANDARD
cmake_minimum_required(VERSION 3.23)
if(NOT CXX_STANDARD)
  set(CXX_STANDARD 17)
endif()
file(REMOVE_RECURSE "${BINARY}")
file(MAKE_DIRECTORY "${BINARY}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer ${KIND}: command failed (${rc}): ${ARGN}")
  endif()
endfunction()

if(KIND STREQUAL "pkg_config")
  set(ENV{PKG_CONFIG_PATH} "${PREFIX}/share/pkgconfig")
  execute_process(COMMAND pkg-config --cflags --libs holdfast RESULT_VARIABLE rc
                  OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config does not know holdfast under ${PREFIX}/share/pkgconfig")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run("${CXX}" -std=c++${CXX_STANDARD} "${MAIN}" ${flags} -o "${BINARY}/consumer")
else()
  run("${CMAKE_COMMAND}" -S "${SOURCE}" -B "${BINARY}"
      "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_CXX_STANDARD=${CXX_STANDARD}"
      "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DHOLDFAST_SOURCE_DIR=${HOLDFAST_SOURCE_DIR}")
  run("${CMAKE_COMMAND}" --build "${BINARY}")
endif()
execute_process(COMMAND "${BINARY}/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer ${KIND} exited with ${rc}")
endif()
