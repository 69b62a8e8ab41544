#!/bin/bash
cd /app && echo "$(cat input.txt)" > answer.txt
