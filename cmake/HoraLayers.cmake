# The layers of csrc/hora, bottom to top: common -> cuda -> comm -> algo ->
# core. Each is a static library that may include only its own headers and
# those of the layers below it: hora_layer() gives a target an include tree
# holding links to just those folders, so an upward #include names a file
# the compiler cannot find and the build fails.
set(HORA_LAYER_ORDER common cuda comm algo core)

# hora_layer(<target> <top layer>): <target> sees <top layer> and below.
function(hora_layer target top)
  list(FIND HORA_LAYER_ORDER "${top}" _top_index)
  if(_top_index LESS 0)
    message(FATAL_ERROR "hora_layer: unknown layer '${top}' (one of ${HORA_LAYER_ORDER})")
  endif()
  set(_root "${CMAKE_BINARY_DIR}/hora_layers/${target}")
  file(REMOVE_RECURSE "${_root}")
  file(MAKE_DIRECTORY "${_root}/hora")
  foreach(_index RANGE ${_top_index})
    list(GET HORA_LAYER_ORDER ${_index} _layer)
    file(CREATE_LINK "${HORA_SOURCE_ROOT}/hora/${_layer}" "${_root}/hora/${_layer}" SYMBOLIC)
  endforeach()
  target_include_directories(${target} PRIVATE "${_root}" "${HORA_GENERATED_INCLUDE}")
endfunction()
