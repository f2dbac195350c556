# Loaded into llama.cpp's CMake run by scripts/test-assets.sh (CMAKE_PROJECT_INCLUDE), to build
# llama-server for the tests in less time: the glue around the model (argument parsing, JSON,
# chat templates, the HTTP server, the multimodal library the server links) at -O1, and the
# first three as unity builds; the compute (ggml, llama) stays as the Release build has it.
# Measured in docs/TESTING.md.
include_guard(GLOBAL)
function(hipscope_quick_glue)
    foreach(t llama-common server-context llama-server-impl cpp-httplib mtmd)
        if(TARGET ${t})
            target_compile_options(${t} PRIVATE -O1)
        endif()
    endforeach()
    # mtmd's helper files refuse to share a unit with its internal headers: not unity.
    foreach(t llama-common server-context llama-server-impl)
        if(TARGET ${t})
            set_target_properties(${t} PROPERTIES UNITY_BUILD ON)
        endif()
    endforeach()
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL hipscope_quick_glue)
