# Shared compile settings for every rdmaflow target.
function(rdmaflow_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-missing-field-initializers)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12 reports false maybe-uninitialized positives inside std::variant/optional at -O2.
    target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized)
    # At -O3 (Release) GCC 12 inlines std::string's operator+ far enough to
    # report impossible sizes in libstdc++'s own memcpy (GCC bugs 105329,
    # 105651); the same code at -O2 is quiet. Only that configuration loses them.
    if(CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12 AND
       CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      target_compile_options(${target} PRIVATE
        $<$<CONFIG:Release>:-Wno-restrict -Wno-stringop-overflow -Wno-array-bounds>)
    endif()
  endif()
  if(RDMAFLOW_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

if(RDMAFLOW_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
if(RDMAFLOW_TSAN)
  # -Wno-tsan: GCC warns that ThreadSanitizer does not model
  # std::atomic_thread_fence, which Boost.Asio's fenced blocks use around
  # handlers; its scheduler's mutexes order those handlers anyway.
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer $<$<CXX_COMPILER_ID:GNU>:-Wno-tsan>)
  add_link_options(-fsanitize=thread)
endif()

# rdmaflow_add_layer(NAME folder SOURCES ... DEPS ...)
# Declares the library target rdmaflow_<folder> (alias rdmaflow::<folder>), installs
# it and its headers (kept beside the sources, included from the repository root).
function(rdmaflow_add_layer folder)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  set(target rdmaflow_${folder})
  add_library(${target} ${ARG_SOURCES})
  add_library(rdmaflow::${folder} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${folder} OUTPUT_NAME rdmaflow_${folder})
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/rdmaflow>)
  target_link_libraries(${target} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  rdmaflow_set_warnings(${target})
  if(RDMAFLOW_SANITIZE)
    # Sanitized static libraries need the runtimes wherever they are linked, also
    # in projects that find_package(rdmaflow) from this install.
    target_link_options(${target} INTERFACE -fsanitize=address,undefined)
  endif()
  if(RDMAFLOW_TSAN)
    target_link_options(${target} INTERFACE -fsanitize=thread)
  endif()
  install(TARGETS ${target} EXPORT rdmaflowTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/rdmaflow/${folder}
          FILES_MATCHING PATTERN "*.h" PATTERN "examples" EXCLUDE)
endfunction()
