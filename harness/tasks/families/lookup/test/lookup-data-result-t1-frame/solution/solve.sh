#!/bin/bash
cd /app && echo "$(cat data.txt)" > result.txt
