#!/bin/bash
cd /app && echo "$(cat key.txt)" > result.txt
