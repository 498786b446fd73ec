# cmake -DCLOSURE_FILE=<file> -DFORBIDDEN=<regex> -P CheckLinkClosure.cmake: fails, naming
# them, when libraries of the closure written by loom_link_closure match FORBIDDEN.
file(STRINGS "${CLOSURE_FILE}" libraries)
set(offenders "")
foreach(library IN LISTS libraries)
  if(library MATCHES "${FORBIDDEN}")
    list(APPEND offenders "${library}")
  endif()
endforeach()
if(offenders)
  message(FATAL_ERROR "${CLOSURE_FILE}: links ${offenders} (forbidden: ${FORBIDDEN})")
endif()
list(LENGTH libraries count)
message(STATUS "${count} libraries, none matching ${FORBIDDEN}")
