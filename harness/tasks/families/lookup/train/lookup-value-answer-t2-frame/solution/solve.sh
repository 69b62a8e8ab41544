#!/bin/bash
cd /app && awk '{print $2}' value.txt > answer.txt
