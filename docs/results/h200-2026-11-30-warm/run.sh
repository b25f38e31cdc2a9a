#!/usr/bin/env bash
# session 34: what a slots group's first verifies pay (journal section 55): four and eight slots at
# synthetic AL 7.67 with the recipe's --spec-verify-max 64, two groups on each server (--repeats
# 2), once with CUDA's default lazy module loading and once with CUDA_MODULE_LOADING=EAGER: a cost
# the second group does not pay, or that eager loading removes, is a once-a-process cost (~10 min
# on 16 cores; summary.txt has each bench's tok/s and each group's, profile.txt the step profiles).
exec bash "$(dirname "$0")/../h200-2026-11-30-share/run.sh" warm
