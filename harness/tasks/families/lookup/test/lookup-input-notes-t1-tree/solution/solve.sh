#!/bin/bash
cd /app && echo "$(cat input.txt)" > notes.txt
