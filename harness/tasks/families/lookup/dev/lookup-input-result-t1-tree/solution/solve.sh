#!/bin/bash
cd /app && echo "$(cat input.txt)" > result.txt
