#!/bin/bash
cd /app && echo "$(cat input.txt)" > out.txt
