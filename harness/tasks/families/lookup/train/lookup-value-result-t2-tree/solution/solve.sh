#!/bin/bash
cd /app && echo "$(cat value.txt)" > result.txt
