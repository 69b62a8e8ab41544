#!/bin/bash
cd /app && echo "$(cat data.txt)" > out.txt
