#!/bin/bash
cd /app && echo "$(cat data.txt)" > answer.txt
