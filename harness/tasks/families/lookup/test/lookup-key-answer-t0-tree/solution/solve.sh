#!/bin/bash
cd /app && echo "$(cat key.txt)" > answer.txt
