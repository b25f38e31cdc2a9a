# Included by llama.cpp's configure (CMAKE_PROJECT_INCLUDE, set by buun's build stage): the C++
# targets that compile as unity builds are built so, up to 16 sources in one compiler run, which
# parses the headers they share once. On 2 cores, cold, the CPU build's targets took 488 core-s
# instead of 663 (docs/development.md). Left out: llama (upstream batches its model files; the rest
# gained nothing) and ggml (its sources define the same static helpers); and, below, the sources
# that clash with their neighbours.
include_guard(GLOBAL)

function(_buun_unity)
    foreach(target llama-common mtmd server-context llama-server-impl llama-bench-impl llama-cli-impl)
        if (TARGET ${target})
            set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 16)
        endif()
    endforeach()
    if (TARGET llama-common)
        # defines its own ordered_json
        get_target_property(dir llama-common SOURCE_DIR)
        set_source_files_properties(${dir}/json.cpp TARGET_DIRECTORY llama-common
                                    PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
    endif()
    if (TARGET mtmd)
        # a public helper library that refuses mtmd's internal headers
        get_target_property(dir mtmd SOURCE_DIR)
        set_source_files_properties(${dir}/mtmd-helper.cpp ${dir}/mtmd-helper-gen.cpp TARGET_DIRECTORY mtmd
                                    PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
    endif()
endfunction()

# the targets exist once the top-level CMakeLists.txt has run
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL _buun_unity)
