#!/bin/bash
cd /app && echo "$(cat value.txt)" > answer.txt
