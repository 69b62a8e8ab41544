#!/bin/bash
cd /app && awk '{print $2}' input.txt > answer.txt
